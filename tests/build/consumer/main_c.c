/* Uses the installed C API (strait.h, libstrait.so through strait::api) from plain C. */
#include <stdio.h>
#include <strait/strait.h>

int main(void) {
  int major = 0, minor = 0, patch = 0;
  strait_host_config_t cfg;
  if (strait_version(&major, &minor, &patch) != STRAIT_SUCCESS ||
      strait_host_config_init(&cfg) != STRAIT_SUCCESS) {
    fprintf(stderr, "consumer_c: %s\n", strait_last_error());
    return 1;
  }
  printf("consumer_c: installed libstrait %d.%d.%d, default timeout %d ms\n", major, minor, patch,
         cfg.timeout_ms);
  return 0;
}
