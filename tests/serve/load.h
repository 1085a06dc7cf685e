// The load generator the load tests share: concurrent streaming clients that check every
// output against an expected text, and the process's resident memory.
#pragma once
#include <functional>

#include "serve/server_fixture.h"

namespace loom::serve::testing {

struct LoadResult {
  int64_t ok = 0, server_errors = 0, mismatches = 0, other = 0;
};

// Expected "<text>#<completion_tokens>" for a prompt, max_tokens and seed.
using ExpectedText = std::function<std::string(const std::string&, int, uint64_t)>;

// `clients` threads each run `per_client` streaming completions back to back, with prompts
// "client C request K" and seeds seed_base + C * per_client + K.
LoadResult run_load(int port, const std::string& model, int clients, int per_client, int max_tokens, int seed_base,
                    const ExpectedText& expected);

int64_t resident_bytes();

}  // namespace loom::serve::testing
