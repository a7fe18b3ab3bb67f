#include "transport/ctrl_message.h"

namespace rdmaxfer {

const char* ctrl_type_name(CtrlType type) {
  switch (type) {
    case CtrlType::kRts: return "RTS";
    case CtrlType::kEager: return "EAGER";
    case CtrlType::kCts: return "CTS";
    case CtrlType::kReject: return "REJECT";
    case CtrlType::kNotify: return "NOTIFY";
    case CtrlType::kAbort: return "ABORT";
  }
  return "unknown";
}

}  // namespace rdmaxfer
