// The environment the dlopen tests of libnccl-net-strait.so share (net_plugin_test.cc for the
// v11 table, net_plugin_versions_test.cc for configuration errors and the v8-v10 and v12 tables):
// the loaded plugin and the STRAIT_* variables every test starts from (loopback, one region).
#ifndef STRAIT_TESTS_PLUGINS_NET_PLUGIN_ENV_H_
#define STRAIT_TESTS_PLUGINS_NET_PLUGIN_ENV_H_

#include <cstdlib>

#include "tests/plugins/plugin_harness.h"

namespace strait::nccl::testing {

inline const LoadedPlugin& Plugin() {
  return LoadPlugin(STRAIT_NCCL_PLUGIN_PATH);
}

inline void SetTestEnvironment() {
  setenv("STRAIT_SOCKET_IFNAME", "lo", 1);
  setenv("STRAIT_REGION", "us-east", 1);
  setenv("STRAIT_NSOCKS", "3", 1);
  setenv("STRAIT_CONNECT_TIMEOUT", "3s", 1);
  for (const char* v :
       {"STRAIT_REGION_MAP", "STRAIT_GATEWAY", "STRAIT_JOB_ID", "STRAIT_COMPRESSION",
        "STRAIT_WAN_LATENCY_US", "STRAIT_WAN_SPEED_MBPS"}) {
    unsetenv(v);
  }
}

}  // namespace strait::nccl::testing

#endif  // STRAIT_TESTS_PLUGINS_NET_PLUGIN_ENV_H_
