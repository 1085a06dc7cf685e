// libFuzzer target: the YAML training config as `loom train CONFIG.yaml` reads it (yaml-cpp,
// then loom's key checks, defaults and validation). Bad input must be refused with a
// loom::Error ("[config] ..."), never crash or leak another exception type.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "loom/core/error.h"
#include "loom/train/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto cfg = loom::train::parse_train_config(text, {}, "fuzz.yaml");
    if (cfg.data.batch_size < 1 || cfg.schedule.steps < 0) __builtin_trap();
  } catch (const loom::Error& e) {
    if (std::strncmp(e.what(), "[config] ", 9) != 0) __builtin_trap();
  }
  return 0;
}
