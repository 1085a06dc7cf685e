// The edge/center cascade in one process: a center and an edge ApiServer over fake engines
// (an edge token's probability is scripted per prompt), the center's manifest and files over
// real HTTP, and the edge's decisions, forwarding, version switch and refusals.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "loom/io/file.h"
#include "loom/io/sha256.h"
#include "loom/serve/cascade/center.h"
#include "loom/serve/cascade/edge.h"
#include "serve/server_fixture.h"

namespace loom::serve::testing {
namespace {

namespace fs = std::filesystem;
using cascade::Edge;
using cascade::EdgeOptions;
using cascade::ModelVersion;

// A stand-in edge model directory: what the manifest lists and an edge downloads.
void write_model(const fs::path& dir, const std::string& weights, const std::string& label) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  io::write_file_atomic((dir / "quant.safetensors").string(), weights);
  io::write_file_atomic((dir / "config.json").string(), R"({"name":"fake"})");
  io::write_file_atomic((dir / "VERSION").string(), label + "\n");
}

// A prompt starting "easy" is one the edge is sure of (probability 0.9), anything else not (0.1).
double scripted_prob(const GenerationRequest& r) { return !r.prompt.empty() && r.prompt[0] == 'e' ? 0.9 : 0.1; }

class CascadeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / ("cascade_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    write_model(root_ / "int8", "weights-int8-v1", "v1");
    write_model(root_ / "int4", "weights-int4-v1", "v1");
    tok_hash_ = cascade::tokenizer_hash(ByteTextTokenizer());
  }
  void TearDown() override {
    if (edge_) edge_->stop();
    if (edge_server_) edge_server_->stop(1);
    if (center_server_) center_server_->stop(1);
    edge_.reset();
    edge_server_.reset();
    center_server_.reset();
    fs::remove_all(root_);
  }

  void start_center(std::vector<ServeOptions::Route> extra = {}) {
    FakeEngineOptions eo;
    eo.version = "center1";
    center_engine_ = std::make_unique<FakeEngine>(eo);
    if (!publisher_)  // kept across restarts: routes taken from it stay valid
      publisher_ = std::make_unique<cascade::CenterPublisher>(
          "big", ModelVersion{"c1", std::string(64, 'c')}, "byte", tok_hash_,
          std::vector<cascade::EdgeModelSource>{{"int8", (root_ / "int8").string()},
                                                {"int4", (root_ / "int4").string()}});
    if (extra.empty()) publisher_->publish();
    ServeOptions opt;
    opt.http.port = 0;
    opt.http.access_log = false;
    opt.served_model_name = "big";
    opt.role = "center";
    opt.routes = extra.empty() ? publisher_->routes() : extra;
    center_server_ = std::make_unique<ApiServer>(opt);
    center_server_->start();
    center_server_->set_engine(center_engine_.get());
  }

  // The edge, with its first poll done. It starts on version `local` of the int8 model.
  void start_edge(EdgeOptions eo, const std::string& local_weights = "weights-int8-v1", bool poll = true) {
    eo.center_url = "http://127.0.0.1:" + std::to_string(center_server_->port());
    eo.cache_dir = (root_ / "edge-cache").string();
    eo.poll_interval_s = 3600;  // the tests poll by hand
    FakeEngineOptions fo;
    fo.token_prob = scripted_prob;
    const ModelVersion local{
        "v1", cascade::version_hash(io::sha256_hex(local_weights), io::sha256_hex(R"({"name":"fake"})"), tok_hash_)};
    fo.version = local.id();
    ServeOptions opt;
    opt.http.port = 0;
    opt.http.access_log = false;
    opt.served_model_name = "small";
    opt.role = "edge";
    edge_server_ = std::make_unique<ApiServer>(opt);
    auto loader = [this](const std::string& dir, const ModelVersion& v) {
      EXPECT_TRUE(fs::exists(fs::path(dir) / "quant.safetensors")) << dir;
      ++loads_;
      FakeEngineOptions o;
      o.token_prob = scripted_prob;
      o.version = v.id();
      o.tick_s = tick_s_;
      return std::shared_ptr<Engine>(std::make_shared<FakeEngine>(o));
    };
    edge_ = std::make_unique<Edge>(
        eo, tok_hash_, local, loader, [this](std::shared_ptr<Engine> e) { edge_server_->set_engine(std::move(e)); },
        &edge_server_->metrics());
    edge_server_->set_edge(edge_.get());
    edge_server_->add_route(edge_->status_route());
    edge_server_->start();
    edge_server_->set_engine(std::shared_ptr<Engine>(std::make_shared<FakeEngine>(fo)));
    if (poll) edge_->poll_once();
  }

  ClientResponse ask(const std::string& prompt, const std::string& model = "small", bool stream = false) {
    HttpClient c("127.0.0.1", edge_server_->port(), 10);
    json body = {{"model", model}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"stream", stream}};
    if (!stream) return c.request("POST", "/v1/completions", body.dump());
    ClientResponse head = c.start_stream("POST", "/v1/completions", body.dump());
    while (auto ev = c.next_event()) head.body += *ev + "\n";
    return head;
  }
  static std::string header(const ClientResponse& r, const char* name) {
    return r.header(name) ? *r.header(name) : std::string("(none)");
  }
  std::string edge_metrics() {
    return HttpClient("127.0.0.1", edge_server_->port(), 10).request("GET", "/metrics").body;
  }

  fs::path root_;
  std::string tok_hash_;
  double tick_s_ = 0.001;
  int loads_ = 0;
  std::unique_ptr<FakeEngine> center_engine_;
  std::unique_ptr<cascade::CenterPublisher> publisher_;
  std::unique_ptr<ApiServer> center_server_, edge_server_;
  std::unique_ptr<Edge> edge_;
};

TEST_F(CascadeTest, ConfidentAnswersStayAtTheEdgeAndTheRestGoToTheCenter) {
  start_center();
  EdgeOptions eo;
  eo.threshold = 0.5;
  eo.quant = "int8";
  start_edge(eo);
  EXPECT_EQ(loads_, 0) << "the edge already runs the int8 model the center offers";

  ClientResponse easy = ask("easy: the same text");
  ASSERT_EQ(easy.status, 200) << easy.body;
  EXPECT_EQ(header(easy, "x-loom-answered-by"), "edge");
  EXPECT_EQ(header(easy, "x-loom-confidence"), "0.9");
  const std::string edge_version = edge_->current().id();
  EXPECT_EQ(json::parse(easy.body)["system_fingerprint"], "loom-edge-" + edge_version);
  EXPECT_EQ(json::parse(easy.body)["choices"][0]["text"], expected_text("easy: the same text", 12, 0, 0));

  ClientResponse hard = ask("hard: something else");
  ASSERT_EQ(hard.status, 200) << hard.body;
  EXPECT_EQ(header(hard, "x-loom-answered-by"), "center");
  EXPECT_EQ(header(hard, "x-loom-forwarded-because"), "confidence");
  EXPECT_EQ(header(hard, "x-loom-edge-version"), edge_version);
  EXPECT_EQ(json::parse(hard.body)["system_fingerprint"], "loom-center-center1");
  EXPECT_EQ(json::parse(hard.body)["choices"][0]["text"], expected_text("hard: something else", 12, 0, 0));

  // Streams decide after the first window too, then stream from whichever answers.
  ClientResponse s_easy = ask("easy streaming", "small", true), s_hard = ask("hard streaming", "small", true);
  EXPECT_EQ(header(s_easy, "x-loom-answered-by"), "edge");
  EXPECT_EQ(header(s_hard, "x-loom-answered-by"), "center");
  EXPECT_NE(s_hard.body.find("loom-center-center1"), std::string::npos) << s_hard.body;
  EXPECT_NE(s_hard.body.find("[DONE]"), std::string::npos) << s_hard.body;
  EXPECT_EQ(s_easy.body.find("center1"), std::string::npos) << "an edge answer mixes in the center: " << s_easy.body;

  const std::string m = edge_metrics();
  EXPECT_NE(m.find("loom_cascade_requests_total{answered_by=\"edge\",edge_version=\"" + edge_version +
                   "\",center_version=\"c1+cccccccccccc\"} 2"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("loom_cascade_requests_total{answered_by=\"center\",edge_version=\"" + edge_version +
                   "\",center_version=\"center1\"} 2"),
            std::string::npos)
      << m;
}

TEST_F(CascadeTest, ARequestForTheCentersModelGoesStraightThere) {
  start_center();
  start_edge({});
  ClientResponse r = ask("easy but for the big model", "big");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(header(r, "x-loom-answered-by"), "center");
  EXPECT_EQ(header(r, "x-loom-forwarded-because"), "model");
  // A model neither serves is refused by the edge, as without a cascade.
  ClientResponse nobody = ask("easy", "nobody");
  EXPECT_EQ(nobody.status, 400);
  EXPECT_NE(nobody.body.find("does not exist"), std::string::npos) << nobody.body;
}

TEST_F(CascadeTest, WithTheCenterDownTheEdgeAnswersLocallyOrRefusesAsConfigured) {
  start_center();
  start_edge({});
  center_server_->stop(0);
  ClientResponse r = ask("hard: needs the center");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(header(r, "x-loom-answered-by"), "edge");
  EXPECT_EQ(header(r, "x-loom-cascade"), "center-unreachable");
  edge_->stop();
  edge_server_->stop(0);

  EdgeOptions fail_opt;
  fail_opt.local_when_center_down = false;
  start_edge(fail_opt, "weights-int8-v1", /*poll=*/false);
  ClientResponse refused = ask("hard: needs the center");
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_NE(refused.body.find("the center cannot be reached"), std::string::npos) << refused.body;
  EXPECT_EQ(ask("easy: the edge is sure").status, 200);
}

TEST_F(CascadeTest, AnUpdateIsDownloadedVerifiedAndSwitchedBetweenRequests) {
  start_center();
  EdgeOptions eo;
  eo.quant = "int8";
  tick_s_ = 0.02;  // the downloaded model is slow, so a stream is still running at the next switch
  start_edge(eo);
  const std::string v1 = edge_->current().id();

  write_model(root_ / "int8", "weights-int8-v2", "v2");
  publisher_->publish();
  edge_->poll_once();
  const std::string v2 = edge_->current().id();
  ASSERT_NE(v1, v2);
  EXPECT_EQ(v2.substr(0, 3), "v2+");
  EXPECT_EQ(loads_, 1);
  EXPECT_TRUE(fs::exists(root_ / "edge-cache" / edge_->current().hash / ".verified"));

  // A stream started on v2 keeps v2 while v3 is installed under it; the next request gets v3.
  HttpClient c("127.0.0.1", edge_server_->port(), 10);
  json body = {
      {"model", "small"}, {"prompt", "easy and long"}, {"max_tokens", 40}, {"temperature", 0}, {"stream", true}};
  ClientResponse head = c.start_stream("POST", "/v1/completions", body.dump());
  EXPECT_EQ(header(head, "x-loom-model-version"), v2);
  write_model(root_ / "int8", "weights-int8-v3", "v3");
  publisher_->publish();
  edge_->poll_once();
  const std::string v3 = edge_->current().id();
  ASSERT_EQ(v3.substr(0, 3), "v3+");
  std::string events;
  while (auto ev = c.next_event()) events += *ev;
  EXPECT_NE(events.find("loom-edge-" + v2), std::string::npos);
  EXPECT_EQ(events.find(v3), std::string::npos) << "a response mixes versions";
  EXPECT_NE(events.find("[DONE]"), std::string::npos);
  EXPECT_EQ(header(ask("easy after"), "x-loom-model-version"), v3);
  EXPECT_NE(edge_metrics().find("loom_cascade_model_updates_total{result=\"installed\"} 2"), std::string::npos);
}

TEST_F(CascadeTest, AManifestWithABadHashIsRefusedAndTheOldModelKept) {
  // A center whose manifest lies about one file's hash, then about the version's hash.
  json manifest;
  std::mutex mu;
  auto serve_manifest = [&](net::HttpExchange& ex) {
    net::HttpResponse r;
    std::lock_guard<std::mutex> lock(mu);
    r.body = manifest.dump();
    ex.respond(r);
  };
  start_center();
  json real = publisher_->manifest();
  std::vector<ServeOptions::Route> routes = publisher_->routes();
  routes[0].handle = serve_manifest;
  center_server_->stop(0);
  start_center(routes);
  write_model(root_ / "int8", "weights-int8-v2", "v2");
  publisher_->publish();  // serves the v2 files
  real = publisher_->manifest();
  {
    std::lock_guard<std::mutex> lock(mu);
    manifest = real;
    manifest["edge_models"]["int8"]["files"][1]["sha256"] = std::string(64, '0');
  }
  EdgeOptions eo;
  eo.quant = "int8";
  start_edge(eo);
  const std::string v1 = edge_->current().id();
  EXPECT_EQ(loads_, 0);
  EXPECT_NE(edge_metrics().find("loom_cascade_model_updates_total{result=\"refused\"} 1"), std::string::npos);
  EXPECT_EQ(header(ask("easy"), "x-loom-model-version"), v1);

  // Files that match their hashes but not the version's hash are refused too (served here
  // whatever version the request names).
  {
    std::lock_guard<std::mutex> lock(mu);
    manifest = real;
    manifest["edge_models"]["int8"]["hash"] = std::string(64, 'a');
  }
  routes[1].handle = [&](net::HttpExchange& ex) {
    const std::string name = ex.request().path.substr(ex.request().path.rfind('/') + 1);
    net::HttpResponse r;
    r.body = io::read_file((root_ / "int8" / name).string());
    ex.respond(r);
  };
  center_server_->stop(0);
  start_center(routes);
  edge_->stop();
  edge_server_->stop(0);
  start_edge(eo);  // a new edge: its metrics start again
  EXPECT_EQ(edge_->current().id(), v1);
  EXPECT_EQ(loads_, 0);
  EXPECT_NE(edge_metrics().find("loom_cascade_model_updates_total{result=\"refused\"} 1"), std::string::npos);
}

TEST_F(CascadeTest, AnEdgeNeverForwardsToACenterWithAnotherTokenizer) {
  start_center();
  json m = publisher_->manifest();
  m["tokenizer"]["hash"] = std::string(64, 'f');
  std::vector<ServeOptions::Route> routes = publisher_->routes();
  routes[0].handle = [m](net::HttpExchange& ex) {
    net::HttpResponse r;
    r.body = m.dump();
    ex.respond(r);
  };
  center_server_->stop(0);
  start_center(routes);
  start_edge({});
  EXPECT_FALSE(edge_->center_usable());
  ClientResponse r = ask("hard: would be forwarded");
  EXPECT_EQ(header(r, "x-loom-answered-by"), "edge");
  EXPECT_EQ(header(r, "x-loom-cascade"), "center-unreachable");
  EXPECT_EQ(center_engine_->submitted(), 0);
}

TEST(CascadeQuant, ChoosesInt4OnASlowLinkALongRoundTripOrLittleMemory) {
  const json both = {{"int8", {{"bytes", 100 << 20}}}, {"int4", {{"bytes", 60 << 20}}}};
  EdgeOptions opt;
  cascade::LinkEstimate fast{0.01, 1e9};
  EXPECT_EQ(cascade::choose_quant(opt, fast, int64_t(8) << 30, both).variant, "int8");
  EXPECT_EQ(cascade::choose_quant(opt, {0.01, 20e6}, int64_t(8) << 30, both).variant, "int4");
  EXPECT_EQ(cascade::choose_quant(opt, {0.3, 1e9}, int64_t(8) << 30, both).variant, "int4");
  const auto mem = cascade::choose_quant(opt, fast, int64_t(150) << 20, both);
  EXPECT_EQ(mem.variant, "int4");
  EXPECT_NE(mem.why.find("memory"), std::string::npos) << mem.why;
  opt.quant = "int8";
  EXPECT_EQ(cascade::choose_quant(opt, {0.01, 20e6}, 0, both).variant, "int8");
  opt.quant = "auto";
  EXPECT_EQ(cascade::choose_quant(opt, {0.01, 20e6}, 0, json{{"int8", {{"bytes", 1}}}}).variant, "int8");
  EXPECT_EQ(cascade::choose_quant(opt, fast, 0, json::object()).variant, "");
}

TEST(CascadeOptions, AThresholdOutsideZeroToOneIsRefused) {
  for (double t : {-0.1, 1.5, std::nan("")}) {
    EdgeOptions o;
    o.threshold = t;
    try {
      o.validate();
      ADD_FAILURE() << t << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--confidence-threshold"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(cascade::parse_edge_models("int8"), Error);
  EXPECT_THROW(cascade::parse_edge_models("int2=x"), Error);
  EXPECT_EQ(cascade::parse_edge_models("int8=a,int4=b").size(), 2u);
}

}  // namespace
}  // namespace loom::serve::testing
