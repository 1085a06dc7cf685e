// `loom serve` options of the process itself: the API key from LOOM_API_KEY (so it does not
// show in ps), and the access log with --no-access-log to silence it.
#include <gtest/gtest.h>

#include <cstdlib>

#include "serve/server_process.h"

namespace loom::serve::testing {
namespace {

const std::vector<std::string> kArgs = {"--model",       "gpt2-tiny", "--served-model-name", "tiny",
                                        "--kv-cache-mb", "4",         "--threads",           "1"};

std::string completion() { return R"({"model": "tiny", "prompt": "hi", "max_tokens": 3, "temperature": 0})"; }

TEST(ServeCli, ApiKeyFromTheEnvironmentAndAnAccessLogLinePerRequest) {
  ::setenv("LOOM_API_KEY", "from-env", 1);
  ServerProcess proc(kArgs);
  ::unsetenv("LOOM_API_KEY");
  ASSERT_TRUE(proc.wait_ready()) << proc.output();
  HttpClient c("127.0.0.1", proc.port(), 10);
  EXPECT_EQ(c.request("POST", "/v1/completions", completion()).status, 401);
  ClientResponse ok = c.request("POST", "/v1/completions", completion(), {{"Authorization", "Bearer from-env"}});
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(proc.stop(SIGTERM), 0);
  const std::string out = proc.output();
  EXPECT_NE(out.find("API key required"), std::string::npos) << out;
  EXPECT_NE(out.find("[access] POST /v1/completions 401 "), std::string::npos) << out;
  // The generation's line adds its id, tokens (prompt + generated) and finish reason.
  EXPECT_NE(out.find("[access] POST /v1/completions 200 "), std::string::npos) << out;
  EXPECT_NE(out.find("+3 finish=length"), std::string::npos) << out;
}

TEST(ServeCli, NoAccessLogAndConflictingKeys) {
  std::vector<std::string> args = kArgs;
  args.push_back("--no-access-log");
  ServerProcess quiet(args);
  ASSERT_TRUE(quiet.wait_ready()) << quiet.output();
  HttpClient c("127.0.0.1", quiet.port(), 10);
  EXPECT_EQ(c.request("POST", "/v1/completions", completion()).status, 200);
  EXPECT_EQ(quiet.stop(SIGTERM), 0);
  EXPECT_EQ(quiet.output().find("[access]"), std::string::npos) << quiet.output();

  ::setenv("LOOM_API_KEY", "one", 1);
  args = kArgs;
  args.insert(args.end(), {"--api-key", "two"});
  ServerProcess both(args);
  ::unsetenv("LOOM_API_KEY");
  EXPECT_FALSE(both.wait_ready(10));
  EXPECT_NE(both.output().find("--api-key and LOOM_API_KEY are both set and differ"), std::string::npos)
      << both.output();
}

}  // namespace
}  // namespace loom::serve::testing
