// How tokens travel between ranks (key fp8_tokens; ep/token_codec.h encodes
// them): f32, or fp8 e4m3 with one scale per tensor (from the global absmax)
// or per token. Gradients always travel in f32.
#pragma once

namespace epmoe::ep {

enum class TokenFormat { f32, fp8_tensor, fp8_token };

}  // namespace epmoe::ep
