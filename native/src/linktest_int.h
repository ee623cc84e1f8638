/* Internal state shared by linktest.c (control, TCP path, JSON) and linktest_rdma.c. */
#ifndef ORCH_LINKTEST_INT_H
#define ORCH_LINKTEST_INT_H

#include <stdatomic.h>

#include "internal.h"

enum { LT_AUTO = 0, LT_TCP = 1, LT_RDMA = 2 };

/* Control frame types (u32 type, u32 length, payload; big-endian). */
enum {
  F_HELLO = 1, F_AUTH, F_AUTH_OK, F_AUTH_FAIL, F_CAPS, F_RDMA_INFO, F_READY, F_PHASE_DONE, F_LAT_RESULT,
  F_BW_RESULT, F_ERROR
};

#define LT_MSG_MAGIC 0x4f4c5450u /* "OLTP" */
#define LT_HDR 16u               /* magic, seq, len, checksum */

typedef struct lt_params {
  uint32_t iterations, warmup, msg_bytes, bw_msg_bytes;
  uint64_t bw_bytes;
} lt_params;

typedef struct lt_stats {
  uint64_t samples;
  double rtt_min_us, rtt_p50_us, rtt_p99_us, rtt_max_us, rtt_mean_us;
  uint64_t lat_sent, lat_received, lat_lost, lat_corrupt;
  uint64_t bw_bytes, bw_ns, bw_sent, bw_received, bw_lost, bw_corrupt;
  bool have_latency, have_bandwidth;
} lt_stats;

struct orch_linktest {
  char token[256];
  uint32_t timeout_ms;
  lt_params p;
  int transport;
  char device[64];
  int gid_index;
  int listen_fd;
  uint16_t port;
  int cancel_pipe[2];
  atomic_int cancelled;
  atomic_int data_fd;
  uint64_t deadline_ns;
  char *result;
  size_t result_len;
  /* facts of the current run, for the result JSON */
  char err[320];
  uint32_t refused;
  char local_addr[64], peer_addr[64], peer_host[64], peer_version[16], peer_reason[128];
  uint16_t local_port, peer_port;
  bool have_peer, peer_rdma;
};

/* Fills a latency message (header + seq-derived pattern) of len bytes. */
void lt_fill(uint8_t *buf, uint32_t len, uint32_t seq);
/* Verifies a latency message; true when intact. */
bool lt_check(const uint8_t *buf, uint32_t len, uint32_t *seq_out);
/* Percentile stats over n RTT samples in ns (sorts them). */
void lt_rtt_stats(uint64_t *rtt_ns, uint64_t n, lt_stats *s);
bool lt_should_stop(orch_linktest *lt, int32_t *why);
int32_t lt_send_frame(orch_linktest *lt, int fd, uint32_t type, const void *payload, uint32_t len);
int32_t lt_recv_frame(orch_linktest *lt, int fd, uint32_t *type, void *payload, uint32_t cap, uint32_t *len);
/* True when the control socket has bytes waiting (non-blocking). */
bool lt_fd_readable(int fd);
/* Receives one frame and requires its type (F_ERROR becomes a protocol error with the text). */
int32_t lt_expect_frame(orch_linktest *lt, int fd, uint32_t want, void *payload, uint32_t cap, uint32_t *len);
/* Sends latency results to the listener and bandwidth results back, so both JSONs are whole. */
int32_t lt_exchange_results(orch_linktest *lt, int fd, bool connector, lt_stats *s);

/* RDMA path: attempts setup and both phases over the established control connection.
 * Returns ORCH_OK with stats filled, or an error with reason: when *fallback is true the
 * caller may still run the TCP path. */
int32_t lt_rdma_run(orch_linktest *lt, int fd, bool connector, const lt_params *p, lt_stats *s, char *device_out,
                    size_t dcap, int *gid_index, bool *uc, bool *fallback, char *reason, size_t rcap);

static inline void put32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}
static inline uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)), put32(p + 4, (uint32_t)v); }
static inline uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }

#endif
