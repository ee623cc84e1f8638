/* GPU probe fallback for platforms without Metal. */
#include <stdio.h>

#include "internal.h"

bool gpu_probe(jbuf *b, probe_err *e) {
  (void)b;
  orch_copy(e->code, sizeof e->code, "unsupported");
  snprintf(e->message, sizeof e->message, "Metal is only available on macOS");
  return false;
}
