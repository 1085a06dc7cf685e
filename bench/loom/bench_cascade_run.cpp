#include "bench/loom/bench_cascade_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/io/file.h"
#include "loom/serve/client/http_client.h"

namespace loom::cli {

namespace {

// Text far from Tiny Shakespeare: what a Shakespeare-trained edge model is unsure about.
const char* const kOutOfDistribution[] = {
    "The build server reported that the integration tests timed out after the database migration",
    "To reset your password, open the settings page, choose security, and follow the link we email",
    "Quarterly revenue from the cloud segment grew faster than analysts expected, while hardware",
    "The function returns a pointer to the first element, or null when the container is empty, so",
    "Our delivery is delayed because the courier could not find the loading dock at the warehouse",
    "Install the package with the system manager, then restart the daemon and check the log file",
    "The neural network was trained on eight accelerators for three days with a cosine schedule and",
    "Please confirm the meeting for Tuesday at ten; the projector in room four is still broken and",
    "Measured latency rose to ninety milliseconds when the cache hit rate dropped below one half",
    "The customer asked whether the subscription renews automatically and how to request a refund",
    "JSON payloads larger than one megabyte are rejected by the gateway with status code 413, and",
    "The satellite images show that the glacier retreated two kilometres over the last decade while",
};

}  // namespace

std::vector<CascadePrompt> cascade_workload(const std::string& corpus, int64_t n, uint64_t seed) {
  const std::string text = io::read_file(corpus);
  LOOM_CHECK(text.size() > 20000, "bench cascade", corpus, " is too short for a workload (", text.size(), " bytes)");
  std::mt19937_64 rng(seed);
  const size_t held_out = text.size() - text.size() / 10;  // the last tenth: validation text
  std::vector<CascadePrompt> out;
  const size_t n_ood = std::size(kOutOfDistribution);
  for (int64_t i = 0; i < n; ++i) {
    if (i % 2 == 1) {
      out.push_back({kOutOfDistribution[(size_t(i) / 2 + seed) % n_ood], false, false, {}});
      continue;
    }
    size_t at = held_out + size_t(rng() % (text.size() - held_out - 400));
    at = text.find('\n', at);
    at = at == std::string::npos ? held_out : at + 1;
    std::string p = text.substr(at, 120);
    const size_t cut = p.find_last_of(" \n");
    if (cut != std::string::npos && cut > 60) p = p.substr(0, cut);
    out.push_back({p, true, false, {}});
  }
  return out;
}

std::vector<CascadePrompt> chat_workload(const std::string& questions, int64_t n, uint64_t seed) {
  std::vector<std::string> lines;
  {
    const std::string text = io::read_file(questions);
    size_t at = 0;
    while (at < text.size()) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      if (end > at) lines.push_back(text.substr(at, end - at));
      at = end + 1;
    }
  }
  LOOM_CHECK(!lines.empty(), "bench cascade", questions, " holds no questions (one a line)");
  std::mt19937_64 rng(seed);
  std::shuffle(lines.begin(), lines.end(), rng);
  std::vector<CascadePrompt> out;
  for (int64_t i = 0; i < n; ++i) out.push_back({lines[size_t(i) % lines.size()], true, true, {}});
  return out;
}

void prepare_prompts(std::vector<CascadePrompt>& prompts, const serve::TextTokenizer& tok,
                     const serve::ChatFormat& chat, int64_t max_prompt_tokens) {
  for (CascadePrompt& p : prompts) {
    if (p.chat) {
      const std::string text = chat.render({{"user", p.text}});
      p.ids = chat.special_tokens() ? tok.encode_special(text) : tok.encode(text);
      LOOM_CHECK(int64_t(p.ids.size()) <= max_prompt_tokens, "bench cascade", "the chat prompt '", p.text, "' is ",
                 p.ids.size(), " tokens through the template, more than the ", max_prompt_tokens,
                 " the context leaves after --max-tokens; lower --max-tokens");
      continue;
    }
    while (int64_t(tok.encode(p.text).size()) > max_prompt_tokens) {
      const size_t space = p.text.find(' ', 1);
      p.text = space == std::string::npos ? p.text.substr(p.text.size() / 2) : p.text.substr(space + 1);
    }
    p.ids = tok.encode(p.text);
  }
}

std::vector<CascadeAnswer> replay_cascade(const std::vector<CascadePrompt>& prompts, const ReplayOptions& opt,
                                          const std::function<void()>& midway) {
  LOOM_CHECK(!opt.urls.empty(), "bench cascade", "no server to send requests to");
  std::mt19937_64 rng(opt.seed);
  std::exponential_distribution<double> gap(opt.rate > 0 ? opt.rate : 1e9);
  std::vector<double> arrivals;
  double t = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    arrivals.push_back(t);
    t += gap(rng);
  }
  std::vector<CascadeAnswer> answers(prompts.size());
  std::vector<std::thread> threads;
  // Clients keep their connections alive, as OpenAI's SDKs do: a request pays the link's round
  // trip, not a new connection's handshake as well (one pool per server).
  std::mutex pool_mu;
  std::map<std::string, std::vector<std::unique_ptr<serve::HttpClient>>> pool;
  auto take = [&](const std::string& u) {
    std::lock_guard<std::mutex> lock(pool_mu);
    auto& free = pool[u];
    if (free.empty()) {
      const serve::Url url = serve::parse_url(u);
      return std::make_unique<serve::HttpClient>(url.host, url.port, opt.timeout_s);
    }
    auto c = std::move(free.back());
    free.pop_back();
    return c;
  };
  auto give_back = [&](const std::string& u, std::unique_ptr<serve::HttpClient> c) {
    std::lock_guard<std::mutex> lock(pool_mu);
    pool[u].push_back(std::move(c));
  };
  const double t0 = now_seconds();
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (midway && i == prompts.size() / 2) midway();
    const double wait = t0 + arrivals[i] - now_seconds();
    if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    threads.emplace_back([&, i] {
      CascadeAnswer& a = answers[i];
      const double start = now_seconds();
      try {
        const std::string& u = opt.urls[i % opt.urls.size()];
        std::unique_ptr<serve::HttpClient> client = take(u);
        const bool chat = prompts[i].chat;
        nlohmann::json body = {
            {"model", opt.model}, {"max_tokens", opt.max_tokens}, {"temperature", 0}, {"return_token_ids", true}};
        if (chat)
          body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", prompts[i].text}}});
        else
          body["prompt"] = prompts[i].text;
        const std::string path = serve::parse_url(u).prefix + (chat ? "/v1/chat/completions" : "/v1/completions"),
                          text = body.dump();
        client->drop_if_stale();
        serve::ClientResponse r = client->request("POST", path, text, {{"Content-Type", "application/json"}});
        if (client->connected()) give_back(u, std::move(client));
        a.latency_s = now_seconds() - start;
        if (std::getenv("LOOM_BENCH_CASCADE_TRACE"))
          std::fprintf(stderr, "[trace] request %zu at %.3f: %.3f s, status %d, %s\n", i, start - t0, a.latency_s,
                       r.status, r.header("x-loom-answered-by") ? r.header("x-loom-answered-by")->c_str() : "?");
        auto header = [&](const char* name) { return r.header(name) ? *r.header(name) : std::string(); };
        a.answered_by = header("x-loom-answered-by");
        a.version = header("x-loom-model-version");
        a.edge_version = header("x-loom-edge-version");
        if (r.header("x-loom-confidence")) a.confidence = std::atof(header("x-loom-confidence").c_str());
        if (r.header("x-loom-confidence-min")) a.confidence_min = std::atof(header("x-loom-confidence-min").c_str());
        if (r.status != 200) {
          a.error = str_cat("status ", r.status, ": ", r.body.substr(0, 200));
          return;
        }
        const nlohmann::json choice = nlohmann::json::parse(r.body)["choices"][0];
        a.text = chat ? choice["message"]["content"].get<std::string>() : choice["text"].get<std::string>();
        a.token_ids = choice.value("token_ids", std::vector<int32_t>{});
        a.ok = true;
      } catch (const std::exception& e) {
        a.latency_s = now_seconds() - start;
        a.error = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  return answers;
}

AnswerScore score_answer(model::Decoder& center, const std::vector<int32_t>& prompt, const std::vector<int32_t>& ans) {
  if (ans.empty()) return {};
  std::vector<int32_t> ids = prompt;
  const int64_t n_ctx = center.config().n_ctx;
  const size_t n_prompt = ids.size();
  ids.insert(ids.end(), ans.begin(), ans.end());
  // Inputs ids[0..n-2], targets ids[1..n-1]; only the answer's tokens are scored.
  std::vector<int32_t> in(ids.begin(), ids.end() - 1), target(ids.begin() + 1, ids.end());
  for (size_t i = 0; i + 1 < n_prompt && i < target.size(); ++i) target[i] = -1;
  if (int64_t(in.size()) > n_ctx) {
    const size_t drop = in.size() - size_t(n_ctx);
    in.erase(in.begin(), in.begin() + int64_t(drop));
    target.erase(target.begin(), target.begin() + int64_t(drop));
  }
  int64_t n_valid = 0;
  const double nll = center.forward(in.data(), target.data(), 1, int64_t(in.size()), &n_valid);
  return {-nll, n_valid};
}

void score_answers(std::vector<CascadeAnswer>& answers, const std::vector<CascadePrompt>& prompts,
                   model::Decoder& center, const std::string& run_name, ScoreCache& cache) {
  const bool trace = std::getenv("LOOM_BENCH_CASCADE_TRACE") != nullptr;
  for (size_t i = 0; i < answers.size(); ++i) {
    CascadeAnswer& a = answers[i];
    if (!a.ok) continue;
    auto [at, fresh] = cache.try_emplace({i, a.token_ids});
    if (fresh) at->second = score_answer(center, prompts[i].ids, a.token_ids);
    a.score = at->second;
    if (trace)
      std::fprintf(stderr, "[trace] %s answer %zu: %lld tokens, mean log p %.3f: %s\n", run_name.c_str(), i,
                   (long long)a.score.tokens, a.score.tokens ? a.score.logprob / double(a.score.tokens) : 0.0,
                   a.text.substr(0, 80).c_str());
  }
}

}  // namespace loom::cli
