// Why a request's generation ended, from the engine (engine.h) to the server's
// finish_reason (serve): one enum for both.
#pragma once

namespace loom::infer {

// error: the request could not go on (its logits were not finite); RequestOutput::error says why.
enum class FinishReason { none, stop, length, abort, error };
const char* finish_reason_name(FinishReason r);

}  // namespace loom::infer
