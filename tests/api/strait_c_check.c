/* strait.h compiled as C99 (pedantic, warnings as errors), linked against libstrait.so: the
 * header needs no C++ and the C API works from C. Exits 0 when every check passes. */
#include <stdio.h>
#include <string.h>

#include "strait/strait.h"

int main(void) {
  int major = -1;
  int minor = -1;
  int patch = -1;
  strait_host_config_t cfg;
  strait_comm_t comm = NULL;
  float x[3] = {1.0f, 2.0f, 3.0f};

  if (strait_version(&major, &minor, &patch) != STRAIT_SUCCESS || major < 0) {
    fprintf(stderr, "strait_version failed: %s\n", strait_last_error());
    return 1;
  }
  if (strait_host_config_init(&cfg) != STRAIT_SUCCESS || cfg.struct_size != sizeof(cfg) ||
      cfg.nranks != 1 || cfg.timeout_ms <= 0) {
    fprintf(stderr, "strait_host_config_init failed: %s\n", strait_last_error());
    return 1;
  }
  /* A NULL comm is rejected before any work, and the last error names it. */
  if (strait_allreduce(x, x, 3, STRAIT_FLOAT32, STRAIT_SUM, comm, NULL) !=
          STRAIT_ERROR_INVALID_ARGUMENT ||
      strstr(strait_last_error(), "comm") == NULL) {
    fprintf(stderr, "a NULL comm was not rejected: %s\n", strait_last_error());
    return 1;
  }
  if (strait_comm_init_nccl(&comm, NULL, NULL, NULL, NULL, NULL) !=
      STRAIT_ERROR_INVALID_ARGUMENT) {
    fprintf(stderr, "strait_comm_init_nccl accepted a NULL nccl_comm\n");
    return 1;
  }
  printf("strait.h from C99: libstrait %d.%d.%d, %s\n", major, minor, patch,
         strait_result_string(STRAIT_ERROR_UNSUPPORTED));
  return 0;
}
