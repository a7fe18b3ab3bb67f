// Python bindings: _core.batch_table, which turns a batch's (local, remote_descriptor,
// remote_offset) entries into the plan's entry table in one pass in C++, so a batch of
// hundreds of thousands of entries costs no Python work per entry in its common shape.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>

#include "protocol/batch.h"

namespace rdmaxfer {

// Columns of a plan's entry table: region index, local offset, descriptor index, remote
// offset, length (protocol/batch.h: BatchRows).
inline constexpr size_t kPlanColumns = BatchRows::kColumns;

void bind_batch_entries(pybind11::module_& m);

}  // namespace rdmaxfer
