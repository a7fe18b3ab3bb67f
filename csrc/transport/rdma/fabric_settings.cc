#include "transport/rdma/fabric_settings.h"

#include <cstdio>
#include <cstdlib>

#include "common/error.h"

namespace rdmaxfer {

namespace {

// The RNR NAK timer codes of the IB spec (9.7.5.2.8), in microseconds; code 0 is the longest.
constexpr int kRnrTimerUs[32] = {655360, 10,    20,    30,    40,    60,    80,    120,
                                 160,    240,   320,   480,   640,   960,   1280,  1920,
                                 2560,   3840,  5120,  7680,  10240, 15360, 20480, 30720,
                                 40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};

uint8_t pick(int argument, const char* arg_name, const char* env_name, int max, int fallback) {
  if (argument >= 0) {
    if (argument > max) {
      throw Error(ErrorKind::kInvalidArgument,
                  std::string(arg_name) + "=" + std::to_string(argument) + " is outside 0.." +
                      std::to_string(max) + "; pass a value in range (or -1 / None for the "
                      "default)");
    }
    return static_cast<uint8_t>(argument);
  }
  if (argument != -1) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(arg_name) + "=" + std::to_string(argument) + " is outside 0.." +
                    std::to_string(max) + " (-1 / None: from " + env_name + ", else " +
                    std::to_string(fallback) + ")");
  }
  const char* env = std::getenv(env_name);
  if (env == nullptr || *env == '\0') return static_cast<uint8_t>(fallback);
  char* end = nullptr;
  const long v = std::strtol(env, &end, 10);
  if (end == env || *end != '\0' || v < 0 || v > max) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(env_name) + "=" + env + " is not an integer in 0.." +
                    std::to_string(max) + "; fix or unset it");
  }
  return static_cast<uint8_t>(v);
}

}  // namespace

FabricSettings resolve_fabric_settings(const RdmaConfig& config) {
  FabricSettings s;
  s.service_level =
      pick(config.service_level, "service_level", "RDMAXFER_SERVICE_LEVEL", 15, 0);
  s.traffic_class =
      pick(config.traffic_class, "traffic_class", "RDMAXFER_TRAFFIC_CLASS", 255, 0);
  s.min_rnr_timer =
      pick(config.min_rnr_timer, "min_rnr_timer", "RDMAXFER_MIN_RNR_TIMER", 31, 18);
  return s;
}

std::string describe_fabric_settings(const FabricSettings& settings) {
  const int us = kRnrTimerUs[settings.min_rnr_timer];
  char rnr[32];
  std::snprintf(rnr, sizeof(rnr), "%.2f ms", us / 1000.0);
  return "SL " + std::to_string(settings.service_level) + ", traffic class " +
         std::to_string(settings.traffic_class) + " (DSCP " +
         std::to_string(settings.traffic_class >> 2) + "), min RNR timer " +
         std::to_string(settings.min_rnr_timer) + " (" + rnr + ")";
}

}  // namespace rdmaxfer
