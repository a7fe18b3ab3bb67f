// Python bindings of batches and notifications (protocol/batch.h, protocol/notifications.h):
// _core.BatchPlan, _core.BatchRun, _core.post_batch, _core.pop_notification and
// _core.notification_fd (and _core.batch_table, bindings/batch_entries.h).
#pragma once

#include <pybind11/pybind11.h>

namespace rdmaxfer {

void bind_batches(pybind11::module_& m);

}  // namespace rdmaxfer
