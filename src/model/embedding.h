// Token embedding lookup (the first layer of the tiny LM, DESIGN.md §4.9):
// out[n, :] = table[ids[n], :].
// Ids are validated by the callers (the data layer); an id outside [0, V)
// here is a bug and raises InternalError (EPMOE_CHECK) before anything is
// written.
#pragma once

#include "core/tensor.h"

namespace epmoe {

// table [V, H] f32, ids [N] i32, out [N, H] f32 preallocated and
// OVERWRITTEN. N may be 0.
void embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out);

// d_table [V, H] is OVERWRITTEN: zeroed, then d_out[n, :] scatter-added to
// row ids[n]. A row hit by several tokens receives their gradients in token
// order, whatever the thread count (threads split the columns, never the
// tokens), so the result is bit-identical for every compute budget.
void embedding_backward(const Tensor& ids, const Tensor& d_out, Tensor& d_table);

}  // namespace epmoe
