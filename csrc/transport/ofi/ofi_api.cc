#include "transport/ofi/ofi_api.h"

#include <dlfcn.h>
#include <signal.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace rdmaxfer {

namespace {

struct LoadedOfi {
  OfiApi api;
  std::string why;  // empty when loaded
};

template <typename Fn>
bool ofi_symbol(void* handle, const char* name, const char* version, Fn* out, std::string* why) {
  void* sym = dlvsym(handle, name, version);
  if (sym == nullptr) {
    const char* err = dlerror();
    *why = std::string("libfabric.so.1 lacks ") + name + "@" + version + ": " +
           (err != nullptr ? err : "symbol not found");
    return false;
  }
  *out = reinterpret_cast<Fn>(sym);
  return true;
}

// Every signal's disposition, saved before dlopen and put back after it: libfabric's
// dependencies may install their own handlers as they load (Debian's libfabric1 pulls in
// libinfinipath, whose constructor catches SIGINT, SIGSEGV, SIGTERM ... to print a backtrace),
// which would take Ctrl-C away from Python.
class SignalDispositions {
 public:
  SignalDispositions() {
    for (int sig = 1; sig < NSIG; ++sig) saved_[sig].ok = sigaction(sig, nullptr, &saved_[sig].act) == 0;
  }
  SignalDispositions(const SignalDispositions&) = delete;
  SignalDispositions& operator=(const SignalDispositions&) = delete;
  ~SignalDispositions() {
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP && saved_[sig].ok) sigaction(sig, &saved_[sig].act, nullptr);
    }
  }

 private:
  struct Saved {
    struct sigaction act {};
    bool ok = false;
  };
  Saved saved_[NSIG];
};

// libfabric's ofi_rxm sizes the completion queue of its MSG endpoints for FI_UNIVERSE_SIZE
// peers (default 1024): (msg rx size + msg tx size, 128 each) x FI_UNIVERSE_SIZE CQEs, over the
// verbs provider 262144, more than rxe's max_cqe (32767), so ibv_create_cq fails and fi_enable
// returns EINVAL. 64 peers (16384 CQEs) fit every verbs device; rxm's connections beyond them
// share the queue. Set only where the environment leaves it unset, before libfabric reads it.
constexpr const char* kOfiUniverseSize = "64";

// FI_AV_REMOVE_CLEANUP=1: fi_av_remove releases what the provider holds for the peer (ofi_rxm:
// its connection). A failed rail rejoins through it (ofi_heal.cc): over verbs;ofi_rxm a rail's
// connection whose QP went to error stays in error, and every later operation on it, even
// from a new endpoint to the same peer, is flushed, until the peer's address is removed and
// inserted again. Set only where the environment leaves it unset, before libfabric reads it.
constexpr const char* kOfiAvRemoveCleanup = "1";

LoadedOfi load_ofi() {
  LoadedOfi l;
  if (setenv("FI_UNIVERSE_SIZE", kOfiUniverseSize, 0) != 0) {
    l.why = std::string("setenv FI_UNIVERSE_SIZE: ") + std::strerror(errno);
    return l;
  }
  if (setenv("FI_AV_REMOVE_CLEANUP", kOfiAvRemoveCleanup, 0) != 0) {
    l.why = std::string("setenv FI_AV_REMOVE_CLEANUP: ") + std::strerror(errno);
    return l;
  }
  const SignalDispositions keep;
  // RTLD_NODELETE: providers keep threads and pointers into the library; never unload it.
  const char* configured = std::getenv("RDMAXFER_OFI_LIBRARY");
  const std::string name =
      configured != nullptr && *configured != 0 ? configured : "libfabric.so.1";
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* err = dlerror();
    l.why = name + " not found: " + (err != nullptr ? err : "dlopen failed") +
            " (install libfabric1, version 1.17 or newer)";
    return l;
  }
  OfiApi& a = l.api;
  std::string* why = &l.why;
  const bool ok = ofi_symbol(handle, "fi_getinfo", "FABRIC_1.3", &a.getinfo, why) &&
                  ofi_symbol(handle, "fi_freeinfo", "FABRIC_1.3", &a.freeinfo, why) &&
                  ofi_symbol(handle, "fi_dupinfo", "FABRIC_1.3", &a.dupinfo, why) &&
                  ofi_symbol(handle, "fi_fabric", "FABRIC_1.1", &a.fabric, why) &&
                  ofi_symbol(handle, "fi_strerror", "FABRIC_1.0", &a.strerror, why) &&
                  ofi_symbol(handle, "fi_version", "FABRIC_1.0", &a.version, why);
  if (!ok) return l;
  const uint32_t v = a.version();
  if (FI_MAJOR(v) < 1 || (FI_MAJOR(v) == 1 && FI_MINOR(v) < 17)) {
    l.why = "libfabric " + std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v)) +
            " is older than 1.17";
  }
  dlerror();
  return l;
}

const LoadedOfi& loaded_ofi() {
  static const LoadedOfi l = load_ofi();  // thread-safe static initialisation
  return l;
}

}  // namespace

const OfiApi* ofi_api(std::string* why) {
  const LoadedOfi& l = loaded_ofi();
  if (!l.why.empty()) {
    if (why != nullptr) *why = l.why;
    return nullptr;
  }
  return &l.api;
}

const OfiApi& ofi() {
  std::string why;
  const OfiApi* api = ofi_api(&why);
  if (api == nullptr) throw Error(ErrorKind::kUnsupported, "ofi transport unavailable: " + why);
  return *api;
}

std::string ofi_error_text(const std::string& op, int ret) {
  const int err = ret < 0 ? -ret : ret;
  const OfiApi* api = ofi_api(nullptr);
  const std::string text = api != nullptr ? api->strerror(err) : "libfabric error";
  return op + ": " + text + " (FI error " + std::to_string(err) + ")";
}

void throw_ofi(const std::string& op, int ret, ErrorKind kind) {
  throw Error(kind, ofi_error_text(op, ret), ret < 0 ? -ret : ret);
}

ErrorKind ofi_completion_kind(int err, int prov_errno) {
  if (err == FI_ECANCELED) {
    // tcp;ofi_rxm cancels an RMA whose target refused the key or range (the provider's errno
    // ENOENT), and every RMA to a peer whose connection broke.
    return prov_errno == ENOENT || prov_errno == EACCES || prov_errno == EINVAL
               ? ErrorKind::kRemoteAccess
               : ErrorKind::kConnection;
  }
  switch (err) {
    case FI_EACCES:
    case FI_EKEYREJECTED:
    case FI_EINVAL:
    case FI_EFAULT:
      return ErrorKind::kRemoteAccess;
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_EHOSTUNREACH:
    case FI_ETIMEDOUT:
    case FI_ESHUTDOWN:
    case FI_EREMOTEIO:
      return ErrorKind::kConnection;
    default: return ErrorKind::kTransport;
  }
}

OfiInfo& OfiInfo::operator=(OfiInfo&& other) noexcept {
  if (this != &other) {
    if (info_ != nullptr) ofi().freeinfo(info_);
    info_ = other.info_;
    other.info_ = nullptr;
  }
  return *this;
}

OfiInfo::~OfiInfo() {
  if (info_ != nullptr) ofi().freeinfo(info_);
}

}  // namespace rdmaxfer
