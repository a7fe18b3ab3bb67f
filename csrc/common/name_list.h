// A list of names as settings and environment variables give it: separated by commas, spaces or
// tabs ("rxe0,rxe2", "mlx5_0 mlx5_1"); empty names dropped.
#pragma once

#include <string>
#include <vector>

namespace rdmaxfer {

inline std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text + ",") {
    if (c == ',' || c == ' ' || c == '\t') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return out;
}

}  // namespace rdmaxfer
