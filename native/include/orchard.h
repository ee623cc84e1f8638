/*
 * liborchard: Orchard's node-side native library (hardware probe and RDMA
 * link test). Pure C ABI, loaded through Deno FFI and used by the
 * orchard-linktest CLI.
 *
 * Conventions: every symbol starts with orch_; handles are opaque; all
 * integers are fixed width; no struct is passed by value and no callback
 * crosses the ABI; functions return an orch_status (0 = ok, negative =
 * error) unless documented otherwise; the library never aborts and never
 * prints. Strings returned as char* are owned by the caller and released
 * with orch_free(); const char* results are static.
 */
#ifndef ORCHARD_H
#define ORCHARD_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define ORCH_API __declspec(dllexport)
#else
#define ORCH_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any incompatible change; the TypeScript binding refuses others. */
#define ORCH_ABI_VERSION 1u

/* Status codes. Values are only ever appended, never renumbered. */
typedef enum orch_status {
  ORCH_OK = 0,
  ORCH_ERR_INVALID_ARG = -1,
  ORCH_ERR_BUFFER_TOO_SMALL = -2,
  ORCH_ERR_NO_MEMORY = -3,
  ORCH_ERR_TIMEOUT = -4,
  ORCH_ERR_CANCELLED = -5,
  ORCH_ERR_UNAVAILABLE = -6,
  ORCH_ERR_IO = -7,
  ORCH_ERR_AUTH = -8,
  ORCH_ERR_PROTOCOL = -9,
  ORCH_ERR_BUSY = -10,
  ORCH_ERR_STATE = -11,
  ORCH_ERR_INTERNAL = -12
} orch_status;

/* Probe flags for orch_probe_json(). */
#define ORCH_PROBE_DEFAULT 0u
#define ORCH_PROBE_SKIP_RDMA 1u   /* do not load or query the verbs library */
#define ORCH_PROBE_SKIP_GPU 2u    /* do not touch Metal */

/* ---- library ---- */

/* Returns ORCH_ABI_VERSION of the loaded build; thread-safe. */
ORCH_API uint32_t orch_abi_version(void);

/* Returns the library version ("0.1.0"), a static string; thread-safe. */
ORCH_API const char *orch_version(void);

/* Returns a static English description of a status code; unknown codes give "unknown status". */
ORCH_API const char *orch_status_str(int32_t status);

/* Frees a string or buffer returned by liborchard; NULL is ignored. */
ORCH_API void orch_free(void *ptr);

/* JSON-escapes a NUL-terminated UTF-8 string (without quotes) into the caller's buffer.
 * Always writes *needed (bytes required including the NUL); returns ORCH_ERR_BUFFER_TOO_SMALL
 * when cap is smaller (out may be NULL when cap is 0). Thread-safe. */
ORCH_API int32_t orch_json_escape(const char *in, char *out, size_t cap, size_t *needed);

/* ---- probe ---- */

/* Probes this machine and returns an orchard.probe/1 JSON document (caller frees with
 * orch_free). Never fails on a missing component: failed sections are null with an entry in
 * errors[]. Bounded by timeout_ms (0 = 5000). Returns NULL only when memory runs out.
 * Thread-safe; may block up to timeout_ms, so call it off the event loop. */
ORCH_API char *orch_probe_json(uint32_t flags, uint32_t timeout_ms);

/* ---- link test ---- */

/* Opaque link test session: one peer, one run. */
typedef struct orch_linktest orch_linktest;

/* Creates a link test session in *out (destroy with orch_linktest_destroy). */
ORCH_API int32_t orch_linktest_create(orch_linktest **out);

/* Destroys a session; NULL is ignored. Must not race with a running call on the same handle. */
ORCH_API void orch_linktest_destroy(orch_linktest *lt);

/* Sets an option before running: token, timeout_ms, iterations, warmup, msg_bytes, bw_bytes,
 * bw_msg_bytes, transport (auto|tcp|rdma), device (rdma_enN / mlx5_0), gid_index.
 * Returns ORCH_ERR_INVALID_ARG for an unknown key or a bad value. */
ORCH_API int32_t orch_linktest_set_option(orch_linktest *lt, const char *key, const char *value);

/* Binds and listens on host:port (host NULL = 0.0.0.0, port 0 = ephemeral); does not block. */
ORCH_API int32_t orch_linktest_listen(orch_linktest *lt, const char *host, uint16_t port);

/* Returns the bound port after orch_linktest_listen, else 0. */
ORCH_API uint16_t orch_linktest_port(const orch_linktest *lt);

/* Accepts one authenticated peer and runs the test as the listener; blocks up to timeout_ms.
 * Connections with a wrong token are refused and the wait goes on for the right peer. */
ORCH_API int32_t orch_linktest_accept_run(orch_linktest *lt);

/* Connects to a listener at host:port and runs the test as the connector; blocks up to timeout_ms. */
ORCH_API int32_t orch_linktest_connect_run(orch_linktest *lt, const char *host, uint16_t port);

/* Cancels a running call from another thread or a signal handler (async-signal-safe). */
ORCH_API void orch_linktest_cancel(orch_linktest *lt);

/* Copies the orchard.linktest/1 JSON of the last run into buf (caller-owned). Always writes
 * *needed (including the NUL); ORCH_ERR_BUFFER_TOO_SMALL when cap is smaller;
 * ORCH_ERR_STATE when nothing ran yet. */
ORCH_API int32_t orch_linktest_result_json(const orch_linktest *lt, char *buf, size_t cap, size_t *needed);

#ifdef __cplusplus
}
#endif

#endif /* ORCHARD_H */
