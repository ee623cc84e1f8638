/* Library-level ABI: versions, status strings, memory release, JSON escaping. */
#include <stdlib.h>

#include "internal.h"

ORCH_API uint32_t orch_abi_version(void) { return ORCH_ABI_VERSION; }

ORCH_API const char *orch_version(void) { return ORCH_VERSION_STRING; }

ORCH_API const char *orch_status_str(int32_t status) {
  switch (status) {
    case ORCH_OK: return "ok";
    case ORCH_ERR_INVALID_ARG: return "invalid argument";
    case ORCH_ERR_BUFFER_TOO_SMALL: return "buffer too small";
    case ORCH_ERR_NO_MEMORY: return "out of memory";
    case ORCH_ERR_TIMEOUT: return "timed out";
    case ORCH_ERR_CANCELLED: return "cancelled";
    case ORCH_ERR_UNAVAILABLE: return "unavailable";
    case ORCH_ERR_IO: return "I/O error";
    case ORCH_ERR_AUTH: return "authentication failed";
    case ORCH_ERR_PROTOCOL: return "protocol error";
    case ORCH_ERR_BUSY: return "busy";
    case ORCH_ERR_STATE: return "invalid state";
    case ORCH_ERR_INTERNAL: return "internal error";
    default: return "unknown status";
  }
}

ORCH_API void orch_free(void *ptr) { free(ptr); }

ORCH_API int32_t orch_json_escape(const char *in, char *out, size_t cap, size_t *needed) {
  if (!in || !needed || (cap > 0 && !out)) return ORCH_ERR_INVALID_ARG;
  size_t need = json_escape_into(in, out, cap);
  *needed = need;
  return need <= cap ? ORCH_OK : ORCH_ERR_BUFFER_TOO_SMALL;
}
