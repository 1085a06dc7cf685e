#include "loom/io/manifest.h"

#include <filesystem>

#include "loom/core/error.h"
#include "loom/io/checksum.h"
#include "loom/io/file.h"

namespace loom::io {

namespace fs = std::filesystem;
using nlohmann::json;

void ManifestWriter::record(const std::string& name) {
  const fs::path p = fs::path(dir_) / name;
  files_[name] = {{"bytes", fs::file_size(p)}, {"crc32c", crc32c_hex(crc32c_file(p.string()))}};
}

void ManifestWriter::write(const std::string& format, int version, const json& extra) const {
  json m = {{"format", format}, {"version", version}};
  for (auto& [k, v] : extra.items()) m[k] = v;
  m["files"] = files_;
  write_file_atomic((fs::path(dir_) / "manifest.json").string(), m.dump(2));
}

std::string manifest_format(const std::string& dir) {
  try {
    return json::parse(read_file((fs::path(dir) / "manifest.json").string())).value("format", "");
  } catch (const std::exception&) {
    return "";
  }
}

int manifest_version(const std::string& dir) {
  try {
    return json::parse(read_file((fs::path(dir) / "manifest.json").string())).value("version", 0);
  } catch (const std::exception&) {
    return 0;
  }
}

bool verify_manifest(const std::string& dir, const std::string& format, int version, std::string* why,
                     const std::function<bool(const std::string&)>& checksum_this, int oldest_version) {
  auto fail_with = [&](const std::string& m) {
    if (why) *why = m;
    return false;
  };
  json manifest;
  try {
    manifest = json::parse(read_file((fs::path(dir) / "manifest.json").string()));
  } catch (const std::exception& e) {
    return fail_with(str_cat("manifest.json unreadable: ", e.what()));
  }
  try {
    if (manifest.value("format", "") != format)
      return fail_with(str_cat("manifest.json is not a ", format, " manifest"));
    const int v = manifest.value("version", 0);
    if (v > version || v < (oldest_version > 0 ? oldest_version : version))
      return fail_with(str_cat("manifest version ", v, ", expected ",
                               oldest_version > 0 && oldest_version < version ? str_cat(oldest_version, " to ") : "",
                               version, v > version ? " (written by a newer loom)" : ""));
    if (!manifest.contains("files") || !manifest["files"].is_object()) return fail_with("manifest.json lists no files");
    for (auto& [name, info] : manifest["files"].items()) {
      const fs::path p = fs::path(dir) / name;
      std::error_code ec;
      const auto size = fs::file_size(p, ec);
      if (ec) return fail_with(str_cat(name, " is missing"));
      const auto want = info.value("bytes", uint64_t(0));
      if (size != want) return fail_with(str_cat(name, " has ", size, " bytes, manifest says ", want, " (truncated?)"));
      if (checksum_this && !checksum_this(name)) continue;
      const std::string crc = crc32c_hex(crc32c_file(p.string()));
      if (crc != info.value("crc32c", ""))
        return fail_with(str_cat(name, " checksum ", crc, " differs from the manifest's ", info.value("crc32c", ""),
                                 " (corrupted)"));
    }
  } catch (const std::exception& e) {  // a malformed entry, an unreadable file
    return fail_with(e.what());
  }
  return true;
}

}  // namespace loom::io
