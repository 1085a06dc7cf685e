#include "loom/serve/cascade/edge.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/io/file.h"
#include "loom/io/sha256.h"
#include "loom/serve/openai_request.h"

namespace loom::serve::cascade {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// The center's identity headers, relayed with their usual spelling.
net::HeaderList relayed_headers(const ClientResponse& r) {
  net::HeaderList out;
  for (const auto& [name, canonical] : {std::pair{"x-loom-answered-by", "X-Loom-Answered-By"},
                                        std::pair{"x-loom-model-version", "X-Loom-Model-Version"}})
    if (const std::string* v = r.header(name)) out.emplace_back(canonical, *v);
  return out;
}

}  // namespace

void EdgeOptions::validate() const {
  if (!(threshold >= 0 && threshold <= 1))
    fail("serve", "--confidence-threshold ", threshold, " is outside [0, 1]: 0 answers every ",
         "request at the edge, 1 forwards all but certain ones");
  if (window < 1) fail("serve", "--window ", window, " must be at least 1 token");
  if (!(poll_interval_s > 0)) fail("serve", "--poll-interval must be > 0 seconds");
  if (quant != "auto" && quant != "int8" && quant != "int4")
    fail("serve", "--edge-quant ", quant, ": expected auto, int8 or int4");
  if (!(int4_below_mbps >= 0) || !(int4_above_rtt_ms > 0))
    fail("serve", "--int4-below-mbps must be >= 0 and --int4-above-rtt-ms > 0");
  if (memory_budget_bytes < 0) fail("serve", "--memory-budget-mb must be >= 0");
}

QuantChoice choose_quant(const EdgeOptions& opt, const LinkEstimate& link, int64_t memory_budget_bytes,
                         const json& edge_models) {
  const bool has8 = edge_models.contains("int8"), has4 = edge_models.contains("int4");
  if (!has8 && !has4) return {"", "the center offers no edge model"};
  auto only = [&](const char* v, const char* missing) {
    return QuantChoice{v, str_cat("the center offers no ", missing, " model")};
  };
  if (opt.quant != "auto") {
    if (edge_models.contains(opt.quant)) return {opt.quant, "--edge-quant " + opt.quant};
    return only(has8 ? "int8" : "int4", opt.quant.c_str());
  }
  if (!has8) return only("int4", "int8");
  if (!has4) return only("int8", "int4");
  const double mbps = link.bandwidth_bps / 1e6, rtt_ms = link.rtt_s * 1e3;
  if (std::isfinite(mbps) && mbps < opt.int4_below_mbps)
    return {"int4", str_cat("link ", mbps, " Mbit/s < ", opt.int4_below_mbps, " Mbit/s")};
  if (std::isfinite(rtt_ms) && rtt_ms > opt.int4_above_rtt_ms)
    return {"int4", str_cat("round trip ", rtt_ms, " ms > ", opt.int4_above_rtt_ms, " ms")};
  const int64_t int8_bytes = edge_models["int8"].value("bytes", int64_t(0));
  if (memory_budget_bytes > 0 && 2 * int8_bytes > memory_budget_bytes)
    return {"int4", str_cat("the int8 model (", int8_bytes >> 20, " MiB) exceeds half the memory budget (",
                            memory_budget_bytes >> 20, " MiB)")};
  return {"int8", str_cat("link ", mbps, " Mbit/s, round trip ", rtt_ms, " ms, memory ", memory_budget_bytes >> 20,
                          " MiB: no constraint")};
}

Edge::Edge(EdgeOptions opt, std::string tokenizer_sha256, ModelVersion local, EngineLoader load,
           EngineInstaller install, net::MetricsRegistry* metrics)
    : opt_(std::move(opt)),
      center_(parse_url(opt_.center_url)),
      tokenizer_sha256_(std::move(tokenizer_sha256)),
      load_(std::move(load)),
      install_(std::move(install)),
      metrics_(metrics),
      current_(std::move(local)) {
  opt_.validate();
  LOOM_CHECK(!opt_.cache_dir.empty(), "serve", "the edge needs a --cache-dir for downloaded models");
  poll_client_ = std::make_unique<HttpClient>(center_.host, center_.port, std::min(opt_.timeout_s, 30.0));
}

Edge::~Edge() { stop(); }

void Edge::start() {
  thread_ = std::thread([this] { loop(); });
}

void Edge::stop() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Edge::loop() {
  while (true) {
    poll_once();
    std::unique_lock<std::mutex> lock(stop_mu_);
    if (stop_cv_.wait_for(lock, std::chrono::duration<double>(opt_.poll_interval_s), [&] { return stopping_; })) return;
  }
}

json Edge::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  auto num = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  return {{"version", current_.id()},
          {"variant", current_variant_},
          {"choice", last_choice_},
          {"choice_why", last_why_},
          {"center_version", center_version_},
          {"center_up", center_up_},
          {"tokenizer_mismatch", tokenizer_mismatch_},
          {"polled", polled_},
          {"link", {{"rtt_s", num(link_.rtt_s)}, {"bandwidth_bps", num(link_.bandwidth_bps)}}}};
}

ServeOptions::Route Edge::status_route() {
  return {"/v1/cascade/status", "GET", [this](net::HttpExchange& ex) {
            net::HttpResponse r;
            r.body = status().dump();
            ex.respond(r);
          }};
}

ModelVersion Edge::current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

LinkEstimate Edge::link() const {
  std::lock_guard<std::mutex> lock(mu_);
  return link_;
}

bool Edge::center_usable() const {
  std::lock_guard<std::mutex> lock(mu_);
  return center_up_ && !tokenizer_mismatch_;
}

std::string Edge::center_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return center_version_;
}

bool Edge::center_serves(const std::string& model) const {
  std::lock_guard<std::mutex> lock(mu_);
  return !center_model_.empty() && model == center_model_;
}

net::HeaderList Edge::auth(const net::HttpRequest* req) const {
  if (req)
    if (const std::string* h = req->header("authorization")) return {{"Authorization", *h}};
  if (!opt_.api_key.empty()) return {{"Authorization", "Bearer " + opt_.api_key}};
  return {};
}

void Edge::note_bandwidth(double bytes, double seconds) {
  if (seconds <= 0 || bytes < 64 * 1024) return;  // too small to say anything about the link
  const double bps = bytes * 8 / seconds;
  std::lock_guard<std::mutex> lock(mu_);
  link_.bandwidth_bps = std::isfinite(link_.bandwidth_bps) ? 0.5 * link_.bandwidth_bps + 0.5 * bps : bps;
  metrics_->gauge("loom_cascade_link_bandwidth_bits_per_second", "the edge's estimate of its link to the center")
      .set(link_.bandwidth_bps);
}

void Edge::poll_once() {
  json m;
  try {
    Stopwatch sw;
    ClientResponse r = poll_client_->request("GET", "/v1/cascade/manifest", "", auth(nullptr));
    const double rtt = sw.seconds();
    LOOM_CHECK(r.status == 200, "cascade", "GET /v1/cascade/manifest answered ", r.status, ": ", r.body.substr(0, 200));
    m = json::parse(r.body);
    LOOM_CHECK(m.value("format", "") == "loom-cascade-manifest", "cascade", "the center's manifest is not a ",
               "loom-cascade-manifest; is --center a loom serve --role center?");
    std::lock_guard<std::mutex> lock(mu_);
    link_.rtt_s = std::isfinite(link_.rtt_s) ? 0.7 * link_.rtt_s + 0.3 * rtt : rtt;
    metrics_->gauge("loom_cascade_link_rtt_seconds", "the edge's estimate of its round trip to the center")
        .set(link_.rtt_s);
    if (!center_up_) std::fprintf(stderr, "[cascade] center %s reachable\n", opt_.center_url.c_str());
    center_up_ = true;
  } catch (const std::exception& e) {
    poll_client_->close();
    std::lock_guard<std::mutex> lock(mu_);
    if (center_up_ || center_version_.empty())
      std::fprintf(stderr, "[cascade] center %s unreachable: %s\n", opt_.center_url.c_str(), e.what());
    center_up_ = false;
    if (center_version_.empty()) center_version_ = "unknown";
    return;
  }
  const std::string center_tok = m["tokenizer"].value("hash", "");
  {
    std::lock_guard<std::mutex> lock(mu_);
    const bool mismatch = center_tok != tokenizer_sha256_;
    if (mismatch && !tokenizer_mismatch_)
      std::fprintf(stderr,
                   "[cascade] the center's tokenizer (%s, %.12s) differs from the edge's (%.12s): this edge "
                   "will not forward to it or take its models; give both the same tokenizer\n",
                   m["tokenizer"].value("name", "?").c_str(), center_tok.c_str(), tokenizer_sha256_.c_str());
    tokenizer_mismatch_ = mismatch;
    if (mismatch) return;
    center_version_ = m["center"].value("version", "");
    center_model_ = m["center"].value("model", "");
  }
  const json& models = m["edge_models"];
  if (!std::isfinite(link().bandwidth_bps) && opt_.quant == "auto" && models.size() > 1) {
    try {  // one measurement before the first choice; downloads refine it
      Stopwatch sw;
      ClientResponse r = poll_client_->request("GET", "/v1/cascade/probe?bytes=1048576", "", auth(nullptr));
      if (r.status == 200) note_bandwidth(double(r.body.size()), sw.seconds());
    } catch (const std::exception& e) {
      poll_client_->close();
    }
  }
  const int64_t budget = opt_.memory_budget_bytes > 0 ? opt_.memory_budget_bytes : mem_available_bytes();
  const QuantChoice choice = choose_quant(opt_, link(), budget, models);
  if (choice.variant.empty()) return;
  const json& target = models[choice.variant];
  const std::string hash = target.value("hash", "");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (choice.variant != last_choice_)
      std::fprintf(stderr, "[cascade] edge weights: %s (%s)\n", choice.variant.c_str(), choice.why.c_str());
    last_choice_ = choice.variant;
    last_why_ = choice.why;
    if (hash == current_.hash) current_variant_ = choice.variant;
    if (hash == current_.hash || refused_.count(hash)) {
      polled_ = true;
      return;
    }
  }
  update(target, choice.variant);
  std::lock_guard<std::mutex> lock(mu_);
  polled_ = true;
}

void Edge::refuse(const std::string& hash, const std::string& id, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  refused_.insert(hash);
  std::fprintf(stderr, "[cascade] refused edge model %s: %s; keeping %s\n", id.c_str(), why.c_str(),
               current_.id().c_str());
  metrics_->counter("loom_cascade_model_updates_total", "edge model updates by result", {{"result", "refused"}}).inc();
}

void Edge::update(const json& target, const std::string& variant) {
  const std::string hash = target.value("hash", ""), id = target.value("version", "?");
  if (hash.size() != 64 || hash.find_first_not_of("0123456789abcdef") != std::string::npos)
    return refuse(hash, id, "the manifest's hash is not a SHA-256 hex digest");
  const fs::path dir = fs::path(opt_.cache_dir) / hash, partial = fs::path(opt_.cache_dir) / (hash + ".partial");
  Stopwatch sw;
  int64_t total = 0;
  try {
    if (!fs::exists(dir / ".verified")) {
      fs::remove_all(partial);
      fs::create_directories(partial);
      HttpClient client(center_.host, center_.port, opt_.timeout_s);
      std::string weights_sha, config_sha;
      for (const json& f : target.at("files")) {
        const std::string name = f.at("name"), want = f.at("sha256");
        if (name.empty() || name.find('/') != std::string::npos || name[0] == '.')
          return refuse(hash, id, str_cat("the manifest names a file '", name, "' outside the model's directory"));
        Stopwatch file_sw;
        ClientResponse r = client.request("GET", str_cat("/v1/cascade/files/", hash, "/", name), "", auth(nullptr));
        LOOM_CHECK(r.status == 200, "cascade", "GET ", name, " answered ", r.status);
        note_bandwidth(double(r.body.size()), file_sw.seconds());
        const std::string got = io::sha256_hex(r.body);
        if (int64_t(r.body.size()) != f.value("bytes", int64_t(-1)) || got != want)
          return refuse(
              hash, id,
              str_cat("file ", name, " has ", r.body.size(), " bytes with SHA-256 ", got.substr(0, 12),
                      ", the manifest says ", f.value("bytes", int64_t(-1)), " bytes with ", want.substr(0, 12)));
        io::write_file_atomic((partial / name).string(), r.body);
        total += int64_t(r.body.size());
        if (name == "config.json") config_sha = got;
        if (name == "quant.safetensors" || (name == "model.safetensors" && weights_sha.empty())) weights_sha = got;
      }
      const std::string rebuilt = version_hash(weights_sha, config_sha, tokenizer_sha256_);
      if (rebuilt != hash)
        return refuse(
            hash, id,
            str_cat("its files hash to version ", rebuilt.substr(0, 12), ", not the manifest's ", hash.substr(0, 12)));
      io::write_file_atomic((partial / ".verified").string(), id + "\n");
      fs::remove_all(dir);
      fs::rename(partial, dir);
    }
  } catch (const std::exception& e) {
    // A transfer that failed (the center went away, a timeout) is tried again at the next poll.
    std::fprintf(stderr, "[cascade] download of edge model %s failed: %s; keeping %s, retrying at the next poll\n",
                 id.c_str(), e.what(), current().id().c_str());
    return;
  }
  const double download_s = sw.seconds();
  const ModelVersion version{target.value("label", "unversioned"), hash};
  std::shared_ptr<Engine> engine;
  try {
    engine = load_(dir.string(), version);
  } catch (const std::exception& e) {
    return refuse(hash, id, str_cat("it does not load: ", e.what()));
  }
  install_(std::move(engine));
  std::lock_guard<std::mutex> lock(mu_);
  std::fprintf(stderr,
               "[cascade] switched to edge model %s (%s, %.1f MB downloaded in %.1f s, loaded in %.1f s), was %s\n",
               version.id().c_str(), variant.c_str(), double(total) / 1e6, download_s, sw.seconds() - download_s,
               current_.id().c_str());
  current_ = version;
  current_variant_ = variant;
  metrics_->counter("loom_cascade_model_updates_total", "edge model updates by result", {{"result", "installed"}})
      .inc();
}

std::unique_ptr<HttpClient> Edge::take_client() {
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (pool_.empty()) return std::make_unique<HttpClient>(center_.host, center_.port, opt_.timeout_s);
  auto c = std::move(pool_.back());
  pool_.pop_back();
  return c;
}

void Edge::keep_client(std::unique_ptr<HttpClient> c) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (c->connected() && pool_.size() < 64) pool_.push_back(std::move(c));
}

Edge::ForwardResult Edge::forward(net::HttpExchange& ex, const net::HeaderList& headers,
                                  const std::function<void()>& taken,
                                  const std::function<void(const std::string& center_version)>& answering) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (tokenizer_mismatch_)
      return {Forwarded::unreachable, "the center's tokenizer differs from the edge's; the edge never forwards to it",
              ""};
  }
  const net::HttpRequest& req = ex.request();
  // The center answers with its own model, whichever model of the cascade the client named.
  bool stream = false;
  std::string body = req.body;
  try {
    json b = json::parse(req.body);
    stream = b.value("stream", false);
    std::lock_guard<std::mutex> lock(mu_);
    if (!center_model_.empty() && b.value("model", "") != center_model_) {
      b["model"] = center_model_;
      body = b.dump();
    }
  } catch (const std::exception&) {
  }
  net::HeaderList out = auth(&req);
  out.emplace_back("Content-Type", "application/json");
  std::unique_ptr<HttpClient> client = take_client();
  client->drop_if_stale();
  const bool reused = client->connected();
  try {
    if (!reused) client->connect();
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu_);
    center_up_ = false;
    return {Forwarded::unreachable, e.what(), ""};
  }
  if (taken) taken();
  // A kept connection the center has closed meanwhile fails at once: one fresh attempt.
  ClientResponse head;
  for (int attempt = 0;; ++attempt) {
    try {
      head =
          stream ? client->start_stream("POST", req.target, body, out) : client->request("POST", req.target, body, out);
      break;
    } catch (const std::exception& e) {
      client->close();
      if (attempt == 0 && reused) {
        try {
          client->connect();
          continue;
        } catch (const std::exception&) {
        }
      }
      answering("");
      ex.respond(error_response(error_for_status(502, str_cat("the center failed during the request: ", e.what()))));
      return {Forwarded::done, "", ""};
    }
  }
  net::HeaderList relay = relayed_headers(head);
  relay.insert(relay.end(), headers.begin(), headers.end());
  ForwardResult result{Forwarded::done, "",
                       head.header("x-loom-model-version") ? *head.header("x-loom-model-version") : ""};
  answering(result.center_version);
  if (!stream) {
    net::HttpResponse r;
    r.status = head.status;
    if (const std::string* ct = head.header("content-type")) r.content_type = *ct;
    r.headers = relay;
    r.body = std::move(head.body);
    ex.respond(r);
    keep_client(std::move(client));
    return result;
  }
  if (head.status != 200) {
    client->close();
    ex.respond(error_response(error_for_status(head.status, str_cat("the center answered ", head.status))));
    return result;
  }
  relay.emplace_back("Cache-Control", "no-cache");
  if (!ex.start_stream(200, "text/event-stream", relay)) return result;  // client gone: drop the center's stream
  try {
    while (std::optional<std::string> ev = client->next_event())
      if (!ex.send_chunk("data: " + *ev + "\n\n")) return result;  // closing ours ends the center's request
    ex.end_stream();
    keep_client(std::move(client));
  } catch (const std::exception& e) {
    ex.send_chunk(
        "data: " + error_response(error_for_status(502, str_cat("the center failed mid-stream: ", e.what()))).body +
        "\n\n");
    ex.end_stream();
  }
  return result;
}

}  // namespace loom::serve::cascade
