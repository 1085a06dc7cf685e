#include "loom/io/yaml_load.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/parser.h>

#include <sstream>

#include "loom/core/error.h"

namespace loom::io {

namespace {
// Fails at the first alias of a YAML event stream: loom's files have no use for them, and
// nested aliases expand exponentially (nine levels of ten make a billion nodes to walk).
class AliasRefuser : public YAML::EventHandler {
 public:
  AliasRefuser(const std::string& source, const char* tag, const char* what)
      : source_(source), tag_(tag), what_(what) {}
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override {
    fail(tag_, source_, ":", mark.line + 1, ": YAML aliases (*name) are not accepted in ", what_,
         "; write the value out where it is used");
  }
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

 private:
  const std::string& source_;
  const char* tag_;
  const char* what_;
};
}  // namespace

YAML::Node load_yaml(const std::string& text, const std::string& source, const char* tag, const char* what) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  AliasRefuser handler(source, tag, what);
  // The first document only: it is the one YAML::Load reads, and on some malformed input
  // (a lone ",") yaml-cpp's parser hands out the same empty document forever.
  try {
    parser.HandleNextDocument(handler);
  } catch (const YAML::Exception&) {
    // Malformed YAML: YAML::Load below reports it.
  }
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail(tag, source, ": not valid YAML: ", e.what());
  }
}

}  // namespace loom::io
