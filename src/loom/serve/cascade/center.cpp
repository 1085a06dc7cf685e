#include "loom/serve/cascade/center.h"

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "loom/core/error.h"
#include "loom/io/sha256.h"
#include "loom/serve/openai_request.h"

namespace loom::serve::cascade {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<EdgeModelSource> parse_edge_models(const std::string& spec) {
  std::vector<EdgeModelSource> out;
  size_t at = 0;
  while (at <= spec.size()) {
    size_t comma = spec.find(',', at);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = spec.substr(at, comma - at);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      fail("serve", "--edge-models '", spec, "': expected VARIANT=DIR[,VARIANT=DIR], e.g. ",
           "int8=runs/edge-int8,int4=runs/edge-int4");
    EdgeModelSource s{item.substr(0, eq), item.substr(eq + 1)};
    if (s.variant != "int8" && s.variant != "int4")
      fail("serve", "--edge-models: variant '", s.variant, "' is not int8 or int4");
    for (const auto& o : out)
      if (o.variant == s.variant) fail("serve", "--edge-models names ", s.variant, " twice");
    out.push_back(std::move(s));
    at = comma + 1;
  }
  return out;
}

CenterPublisher::CenterPublisher(std::string model_name, ModelVersion center, std::string tokenizer_name,
                                 std::string tokenizer_sha256, std::vector<EdgeModelSource> sources)
    : model_name_(std::move(model_name)),
      tokenizer_name_(std::move(tokenizer_name)),
      tokenizer_sha256_(std::move(tokenizer_sha256)),
      center_(std::move(center)),
      sources_(std::move(sources)) {}

void CenterPublisher::publish() {
  json edge_models = json::object();
  std::map<std::string, Published> found;
  for (const EdgeModelSource& s : sources_) {
    std::error_code ec;
    const fs::path dir = fs::canonical(s.dir, ec);
    LOOM_CHECK(!ec && fs::is_directory(dir), "cascade", "edge model ", s.variant, " at ", s.dir,
               " is not a directory; give a `loom quantize` output");
    Published pub{dir.string(), {}};
    std::string weights_sha, config_sha;
    const std::string weights = weights_file(pub.dir);
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (!e.is_regular_file() || name.rfind("optimizer.", 0) == 0) continue;  // not needed to serve
      PublishedFile f{name, int64_t(e.file_size()), io::sha256_file(e.path().string())};
      if (name == weights) weights_sha = f.sha256;
      if (name == "config.json") config_sha = f.sha256;
      pub.files.push_back(std::move(f));
    }
    LOOM_CHECK(!config_sha.empty(), "cascade", "edge model ", s.variant, " at ", s.dir, " has no config.json");
    std::sort(pub.files.begin(), pub.files.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    const ModelVersion v = checkpoint_version(pub.dir, tokenizer_sha256_);
    LOOM_CHECK(v.hash == version_hash(weights_sha, config_sha, tokenizer_sha256_), "cascade", "edge model ", s.variant,
               " at ", s.dir, " changed while it was being published; publish again");
    json files = json::array();
    int64_t total = 0;
    for (const auto& f : pub.files) {
      files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"sha256", f.sha256}});
      total += f.bytes;
    }
    edge_models[s.variant] = {
        {"version", v.id()}, {"label", v.label}, {"hash", v.hash}, {"bytes", total}, {"files", files}};
    found[v.hash] = std::move(pub);
  }
  json m = {
      {"format", "loom-cascade-manifest"},
      {"center", {{"model", model_name_}, {"version", center_.id()}, {"label", center_.label}, {"hash", center_.hash}}},
      {"tokenizer", {{"name", tokenizer_name_}, {"hash", tokenizer_sha256_}}},
      {"edge_models", edge_models},
      {"published", int64_t(std::time(nullptr))}};
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [hash, pub] : found) published_[hash] = std::move(pub);
  manifest_ = std::move(m);
}

json CenterPublisher::manifest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return manifest_;
}

std::vector<ServeOptions::Route> CenterPublisher::routes() {
  return {{"/v1/cascade/manifest", "GET",
           [this](net::HttpExchange& ex) {
             net::HttpResponse r;
             r.headers.emplace_back("Cache-Control", "no-cache");
             r.body = manifest().dump();
             ex.respond(r);
           }},
          {"/v1/cascade/files/", "GET", [this](net::HttpExchange& ex) { serve_file(ex); }},
          {"/v1/cascade/probe", "GET", [this](net::HttpExchange& ex) { serve_probe(ex); }}};
}

void CenterPublisher::serve_file(net::HttpExchange& ex) {
  // /v1/cascade/files/<hash>/<name>: only names the manifest lists, so no path leaves the directory.
  const std::string rest = ex.request().path.substr(std::string("/v1/cascade/files/").size());
  const size_t slash = rest.find('/');
  const std::string hash = rest.substr(0, slash), name = slash == std::string::npos ? "" : rest.substr(slash + 1);
  std::string path;
  int64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = published_.find(hash);
    if (it != published_.end())
      for (const auto& f : it->second.files)
        if (f.name == name) {
          path = (fs::path(it->second.dir) / f.name).string();
          bytes = f.bytes;
        }
  }
  if (path.empty())
    return ex.respond(
        error_response(error_for_status(404, str_cat("no published file ", rest, "; see GET /v1/cascade/manifest"))));
  std::ifstream in(path, std::ios::binary);
  if (!in) return ex.respond(error_response(error_for_status(500, str_cat("cannot read the published file ", name))));
  if (!ex.start_stream(200, "application/octet-stream", {{"X-Loom-File-Bytes", std::to_string(bytes)}})) return;
  std::vector<char> buf(size_t(1) << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    const std::streamsize n = in.gcount();
    if (n > 0 && !ex.send_chunk(std::string_view(buf.data(), size_t(n)))) return;
  }
  ex.end_stream();
}

void CenterPublisher::serve_probe(net::HttpExchange& ex) {
  const std::string& q = ex.request().query;
  int64_t n = 1 << 20;
  if (q.rfind("bytes=", 0) == 0) {
    try {
      n = std::stoll(q.substr(6));
    } catch (const std::exception&) {
      n = -1;
    }
  }
  if (n < 1 || n > (int64_t(16) << 20))
    return ex.respond(error_response(error_for_status(400, "probe: bytes must be in [1, 16777216]")));
  net::HttpResponse r;
  r.content_type = "application/octet-stream";
  r.body.assign(size_t(n), 'x');
  ex.respond(r);
}

}  // namespace loom::serve::cascade
