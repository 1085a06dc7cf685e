// The center of an edge/center cascade (docs/CASCADE.md): publishes GET /v1/cascade/manifest
// (its own version, the tokenizer's hash, and the edge models it offers in int8 and int4 with
// every file's size and SHA-256), serves those files, and answers a bandwidth probe. The center
// answers generation requests like any loom server; this is only what edges fetch from it.
#pragma once
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/serve/api_server.h"
#include "loom/serve/cascade/version.h"

namespace loom::serve::cascade {

struct EdgeModelSource {
  std::string variant;  // "int8" or "int4": how edges choose (edge.h)
  std::string dir;      // a `loom quantize` output (or any checkpoint); links are resolved at publish()
};

// "int8=DIR,int4=DIR" as `loom serve --edge-models` takes it. Throws "[serve] --edge-models ...".
std::vector<EdgeModelSource> parse_edge_models(const std::string& spec);

struct PublishedFile {
  std::string name;
  int64_t bytes = 0;
  std::string sha256;
};

class CenterPublisher {
 public:
  CenterPublisher(std::string model_name, ModelVersion center, std::string tokenizer_name, std::string tokenizer_sha256,
                  std::vector<EdgeModelSource> sources);
  // (Re)reads every source directory and hashes its files: the manifest then offers what they
  // hold now. Versions published before stay downloadable, so an edge in the middle of a
  // download finishes it. Throws "[cascade] ..." naming the directory; the manifest is then
  // unchanged.
  void publish();
  nlohmann::json manifest() const;
  // GET /v1/cascade/manifest, /v1/cascade/files/<hash>/<name>, /v1/cascade/probe?bytes=N.
  std::vector<ServeOptions::Route> routes();

 private:
  void serve_file(net::HttpExchange& ex);
  void serve_probe(net::HttpExchange& ex);

  const std::string model_name_, tokenizer_name_, tokenizer_sha256_;
  const ModelVersion center_;
  const std::vector<EdgeModelSource> sources_;
  mutable std::mutex mu_;
  nlohmann::json manifest_;
  struct Published {
    std::string dir;
    std::vector<PublishedFile> files;
  };
  std::map<std::string, Published> published_;  // by version hash
};

}  // namespace loom::serve::cascade
