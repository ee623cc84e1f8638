/* Link test session: authenticated TCP control connection, capability exchange, RDMA attempt
 * (linktest_rdma.c) with a TCP fallback measured the same way, and the orchard.linktest/1 result. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "linktest_int.h"
#include "rdma.h"
#include "sha256.h"

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0 /* macOS: SO_NOSIGPIPE is set on each socket instead */
#endif

#define MAX_MSG_BYTES (1u << 20)
#define MAX_BW_MSG_BYTES (4u << 20)
#define CAPS_LEN 306u

static const char CLIENT_LABEL[] = "orchard-linktest/1 connector";
static const char SERVER_LABEL[] = "orchard-linktest/1 listener";

ORCH_API int32_t orch_linktest_create(orch_linktest **out) {
  if (!out) return ORCH_ERR_INVALID_ARG;
  *out = NULL;
  orch_linktest *lt = calloc(1, sizeof *lt);
  if (!lt) return ORCH_ERR_NO_MEMORY;
  if (pipe(lt->cancel_pipe) != 0) {
    free(lt);
    return ORCH_ERR_IO;
  }
  for (int i = 0; i < 2; i++) {
    fcntl(lt->cancel_pipe[i], F_SETFD, FD_CLOEXEC);
    fcntl(lt->cancel_pipe[i], F_SETFL, O_NONBLOCK);
  }
  lt->timeout_ms = 30000;
  lt->p = (lt_params){.iterations = 1000, .warmup = 100, .msg_bytes = 64, .bw_msg_bytes = 256 * 1024,
                      .bw_bytes = 64ull << 20};
  lt->gid_index = -1;
  lt->listen_fd = -1;
  atomic_init(&lt->cancelled, 0);
  atomic_init(&lt->data_fd, -1);
  *out = lt;
  return ORCH_OK;
}

ORCH_API void orch_linktest_destroy(orch_linktest *lt) {
  if (!lt) return;
  if (lt->listen_fd >= 0) close(lt->listen_fd);
  close(lt->cancel_pipe[0]);
  close(lt->cancel_pipe[1]);
  free(lt->result);
  free(lt);
}

static bool parse_u64(const char *v, uint64_t min, uint64_t max, uint64_t *out) {
  if (!v || !*v) return false;
  char *end = NULL;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (errno || *end || v[0] == '-' || n < min || n > max) return false;
  *out = n;
  return true;
}

ORCH_API int32_t orch_linktest_set_option(orch_linktest *lt, const char *key, const char *value) {
  if (!lt || !key || !value) return ORCH_ERR_INVALID_ARG;
  uint64_t n;
  if (strcmp(key, "token") == 0) {
    size_t len = strlen(value);
    if (len == 0 || len >= sizeof lt->token) return ORCH_ERR_INVALID_ARG;
    memcpy(lt->token, value, len + 1);
  } else if (strcmp(key, "timeout_ms") == 0 && parse_u64(value, 1, 3600000, &n)) {
    lt->timeout_ms = (uint32_t)n;
  } else if (strcmp(key, "iterations") == 0 && parse_u64(value, 1, 1000000, &n)) {
    lt->p.iterations = (uint32_t)n;
  } else if (strcmp(key, "warmup") == 0 && parse_u64(value, 0, 100000, &n)) {
    lt->p.warmup = (uint32_t)n;
  } else if (strcmp(key, "msg_bytes") == 0 && parse_u64(value, LT_HDR, MAX_MSG_BYTES, &n)) {
    lt->p.msg_bytes = (uint32_t)n;
  } else if (strcmp(key, "bw_msg_bytes") == 0 && parse_u64(value, 64, MAX_BW_MSG_BYTES, &n)) {
    lt->p.bw_msg_bytes = (uint32_t)n;
  } else if (strcmp(key, "bw_bytes") == 0 && parse_u64(value, 0, 1ull << 36, &n)) {
    lt->p.bw_bytes = n;
  } else if (strcmp(key, "transport") == 0) {
    if (strcmp(value, "auto") == 0) lt->transport = LT_AUTO;
    else if (strcmp(value, "tcp") == 0) lt->transport = LT_TCP;
    else if (strcmp(value, "rdma") == 0) lt->transport = LT_RDMA;
    else return ORCH_ERR_INVALID_ARG;
  } else if (strcmp(key, "device") == 0) {
    if (strlen(value) >= sizeof lt->device) return ORCH_ERR_INVALID_ARG;
    orch_copy(lt->device, sizeof lt->device, value);
  } else if (strcmp(key, "gid_index") == 0 && parse_u64(value, 0, 255, &n)) {
    lt->gid_index = (int)n;
  } else {
    return ORCH_ERR_INVALID_ARG;
  }
  return ORCH_OK;
}

ORCH_API void orch_linktest_cancel(orch_linktest *lt) {
  if (!lt) return;
  atomic_store(&lt->cancelled, 1);
  ssize_t w = write(lt->cancel_pipe[1], "x", 1);
  (void)w;
  int fd = atomic_load(&lt->data_fd);
  if (fd >= 0) shutdown(fd, SHUT_RDWR); /* wakes a blocked send/recv */
}

ORCH_API uint16_t orch_linktest_port(const orch_linktest *lt) { return lt ? lt->port : 0; }

ORCH_API int32_t orch_linktest_result_json(const orch_linktest *lt, char *buf, size_t cap, size_t *needed) {
  if (!lt || !needed || (cap && !buf)) return ORCH_ERR_INVALID_ARG;
  if (!lt->result) {
    *needed = 0;
    return ORCH_ERR_STATE;
  }
  *needed = lt->result_len + 1;
  if (cap < lt->result_len + 1) return ORCH_ERR_BUFFER_TOO_SMALL;
  memcpy(buf, lt->result, lt->result_len + 1);
  return ORCH_OK;
}

bool lt_should_stop(orch_linktest *lt, int32_t *why) {
  if (atomic_load(&lt->cancelled)) {
    *why = ORCH_ERR_CANCELLED;
    return true;
  }
  if (orch_now_ns() >= lt->deadline_ns) {
    *why = ORCH_ERR_TIMEOUT;
    return true;
  }
  return false;
}

/* Blocking full send/recv; sockets carry a 200 ms timeout so cancel and deadline are seen. */
static int32_t io_full(orch_linktest *lt, int fd, void *buf, size_t n, bool sending) {
  uint8_t *p = buf;
  size_t done = 0;
  while (done < n) {
    ssize_t r = sending ? send(fd, p + done, n - done, MSG_NOSIGNAL) : recv(fd, p + done, n - done, 0);
    if (r > 0) {
      done += (size_t)r;
      continue;
    }
    int32_t why;
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (lt_should_stop(lt, &why)) return why;
      continue;
    }
    if (atomic_load(&lt->cancelled)) return ORCH_ERR_CANCELLED;
    snprintf(lt->err, sizeof lt->err, "%s", r == 0 ? "peer closed the connection" : strerror(errno));
    return ORCH_ERR_IO;
  }
  return ORCH_OK;
}

int32_t lt_send_frame(orch_linktest *lt, int fd, uint32_t type, const void *payload, uint32_t len) {
  uint8_t hdr[8];
  put32(hdr, type);
  put32(hdr + 4, len);
  int32_t rc = io_full(lt, fd, hdr, 8, true);
  if (rc == ORCH_OK && len) rc = io_full(lt, fd, (void *)(uintptr_t)payload, len, true);
  return rc;
}

int32_t lt_recv_frame(orch_linktest *lt, int fd, uint32_t *type, void *payload, uint32_t cap, uint32_t *len) {
  uint8_t hdr[8];
  int32_t rc = io_full(lt, fd, hdr, 8, false);
  if (rc != ORCH_OK) return rc;
  *type = get32(hdr);
  *len = get32(hdr + 4);
  if (*len > cap) {
    snprintf(lt->err, sizeof lt->err, "control frame of %u bytes exceeds %u", *len, cap);
    return ORCH_ERR_PROTOCOL;
  }
  return *len ? io_full(lt, fd, payload, *len, false) : ORCH_OK;
}

bool lt_fd_readable(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, 0) > 0;
}

int32_t lt_expect_frame(orch_linktest *lt, int fd, uint32_t want, void *payload, uint32_t cap, uint32_t *len) {
  uint32_t type;
  int32_t rc = lt_recv_frame(lt, fd, &type, payload, cap, len);
  if (rc != ORCH_OK) return rc;
  if (type == F_ERROR) {
    snprintf(lt->err, sizeof lt->err, "peer reported: %.*s", (int)(*len < 200 ? *len : 200), (const char *)payload);
    return ORCH_ERR_PROTOCOL;
  }
  if (type != want) {
    snprintf(lt->err, sizeof lt->err, "expected control frame %u, got %u", want, type);
    return type == F_AUTH_FAIL ? ORCH_ERR_AUTH : ORCH_ERR_PROTOCOL;
  }
  return ORCH_OK;
}

/* ---- message helpers shared with the RDMA path ---- */

static uint32_t fnv1a(const uint8_t *p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
  return h;
}

void lt_fill(uint8_t *buf, uint32_t len, uint32_t seq) {
  for (uint32_t i = LT_HDR; i < len; i++) buf[i] = (uint8_t)(seq * 31u + i);
  put32(buf, LT_MSG_MAGIC);
  put32(buf + 4, seq);
  put32(buf + 8, len);
  put32(buf + 12, fnv1a(buf + LT_HDR, len - LT_HDR));
}

bool lt_check(const uint8_t *buf, uint32_t len, uint32_t *seq_out) {
  if (len < LT_HDR || get32(buf) != LT_MSG_MAGIC || get32(buf + 8) != len) return false;
  *seq_out = get32(buf + 4);
  return get32(buf + 12) == fnv1a(buf + LT_HDR, len - LT_HDR);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

void lt_rtt_stats(uint64_t *rtt, uint64_t n, lt_stats *s) {
  s->samples = n;
  if (!n) return;
  qsort(rtt, n, sizeof *rtt, cmp_u64);
  double sum = 0;
  for (uint64_t i = 0; i < n; i++) sum += (double)rtt[i];
  uint64_t i50 = (n * 50 + 99) / 100, i99 = (n * 99 + 99) / 100;
  s->rtt_min_us = (double)rtt[0] / 1e3;
  s->rtt_p50_us = (double)rtt[i50 ? i50 - 1 : 0] / 1e3;
  s->rtt_p99_us = (double)rtt[i99 ? i99 - 1 : 0] / 1e3;
  s->rtt_max_us = (double)rtt[n - 1] / 1e3;
  s->rtt_mean_us = (double)(uint64_t)(sum / (double)n + 0.5) / 1e3; /* whole ns: both sides report the same */
  s->have_latency = true;
}

/* ---- TCP path: ping-pong then a receiver-timed stream, on the control socket ---- */

static int32_t tcp_latency(orch_linktest *lt, int fd, bool connector, const lt_params *p, lt_stats *s) {
  uint32_t total = p->warmup + p->iterations;
  uint8_t *buf = malloc(p->msg_bytes), *expect = malloc(p->msg_bytes);
  uint64_t *rtt = connector ? calloc(p->iterations ? p->iterations : 1, sizeof *rtt) : NULL;
  int32_t rc = (buf && expect && (!connector || rtt)) ? ORCH_OK : ORCH_ERR_NO_MEMORY;
  uint64_t n = 0;
  for (uint32_t i = 0; rc == ORCH_OK && i < total; i++) {
    uint32_t seq = 0;
    if (connector) {
      lt_fill(buf, p->msg_bytes, i);
      uint64_t t0 = orch_now_ns();
      rc = io_full(lt, fd, buf, p->msg_bytes, true);
      if (rc == ORCH_OK) rc = io_full(lt, fd, buf, p->msg_bytes, false);
      uint64_t t1 = orch_now_ns();
      if (rc != ORCH_OK) break;
      s->lat_sent++;
      s->lat_received++;
      if (!lt_check(buf, p->msg_bytes, &seq) || seq != i) s->lat_corrupt++;
      if (i >= p->warmup) rtt[n++] = t1 - t0;
    } else {
      rc = io_full(lt, fd, buf, p->msg_bytes, false);
      if (rc != ORCH_OK) break;
      s->lat_received++;
      if (!lt_check(buf, p->msg_bytes, &seq)) s->lat_corrupt++;
      else if (seq > i) s->lat_lost += seq - i;
      rc = io_full(lt, fd, buf, p->msg_bytes, true); /* echo as received */
      s->lat_sent++;
    }
  }
  if (rc == ORCH_OK && connector) lt_rtt_stats(rtt, n, s);
  free(buf);
  free(expect);
  free(rtt);
  return rc;
}

static int32_t tcp_bandwidth(orch_linktest *lt, int fd, bool connector, const lt_params *p, lt_stats *s) {
  uint32_t m = p->bw_msg_bytes;
  uint64_t count = p->bw_bytes / m;
  if (count == 0) return ORCH_OK;
  uint8_t *buf = malloc(m);
  if (!buf) return ORCH_ERR_NO_MEMORY;
  for (uint32_t i = 16; i < m - 8; i++) buf[i] = (uint8_t)(i * 7u);
  int32_t rc = ORCH_OK;
  uint64_t t_first = 0, t_last = 0;
  uint64_t expect = 0;
  for (uint64_t i = 0; rc == ORCH_OK && i < count; i++) {
    if (connector) {
      /* stamp seq at both ends: a torn or reordered message shows up as corrupt */
      put64(buf, i);
      put64(buf + 8, ~i);
      put64(buf + m - 8, i);
      rc = io_full(lt, fd, buf, m, true);
      if (rc == ORCH_OK) s->bw_sent++;
    } else {
      rc = io_full(lt, fd, buf, m, false);
      if (rc != ORCH_OK) break;
      t_last = orch_now_ns();
      if (i == 0) t_first = t_last;
      s->bw_received++;
      uint64_t seq = get64(buf);
      if (get64(buf + 8) != ~seq || get64(buf + m - 8) != seq) s->bw_corrupt++;
      else if (seq > expect) s->bw_lost += seq - expect, expect = seq + 1;
      else expect++;
    }
  }
  if (rc == ORCH_OK && !connector) {
    /* receiver-timed from the end of the first message to the end of the last */
    s->bw_bytes = count > 1 ? (count - 1) * m : m;
    s->bw_ns = t_last > t_first ? t_last - t_first : 1;
    s->have_bandwidth = true;
  }
  free(buf);
  return rc;
}

/* Results travel to the other side so both JSON documents are complete. */
int32_t lt_exchange_results(orch_linktest *lt, int fd, bool connector, lt_stats *s) {
  uint8_t b[96];
  uint32_t len;
  int32_t rc;
  if (connector) {
    put64(b, s->samples);
    double v[5] = {s->rtt_min_us, s->rtt_p50_us, s->rtt_p99_us, s->rtt_max_us, s->rtt_mean_us};
    for (int i = 0; i < 5; i++) put64(b + 8 + 8 * i, (uint64_t)(v[i] * 1000.0 + 0.5));
    put64(b + 48, s->lat_sent);
    put64(b + 56, s->lat_corrupt);
    put64(b + 64, s->bw_sent);
    rc = lt_send_frame(lt, fd, F_LAT_RESULT, b, 72);
    if (rc == ORCH_OK) rc = lt_expect_frame(lt, fd, F_BW_RESULT, b, sizeof b, &len);
    if (rc == ORCH_OK && len >= 48) {
      s->bw_bytes = get64(b), s->bw_ns = get64(b + 8), s->bw_received = get64(b + 16);
      s->bw_lost = get64(b + 24), s->bw_corrupt = get64(b + 32);
      s->lat_lost += get64(b + 40);
      s->have_bandwidth = s->bw_ns > 0;
    }
  } else {
    rc = lt_expect_frame(lt, fd, F_LAT_RESULT, b, sizeof b, &len);
    if (rc == ORCH_OK && len >= 72) {
      s->samples = get64(b);
      double *v[5] = {&s->rtt_min_us, &s->rtt_p50_us, &s->rtt_p99_us, &s->rtt_max_us, &s->rtt_mean_us};
      for (int i = 0; i < 5; i++) *v[i] = (double)get64(b + 8 + 8 * i) / 1000.0;
      s->lat_corrupt += get64(b + 56);
      s->bw_sent = get64(b + 64);
      s->have_latency = s->samples > 0;
      if (s->bw_sent > s->bw_received + s->bw_lost) s->bw_lost = s->bw_sent - s->bw_received;
    }
    put64(b, s->bw_bytes), put64(b + 8, s->bw_ns), put64(b + 16, s->bw_received);
    put64(b + 24, s->bw_lost), put64(b + 32, s->bw_corrupt), put64(b + 40, s->lat_lost);
    if (rc == ORCH_OK) rc = lt_send_frame(lt, fd, F_BW_RESULT, b, 48);
  }
  return rc;
}

/* ---- control connection ---- */

static void sock_setup(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
#ifdef SO_NOSIGPIPE
  setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
  struct timeval tv = {.tv_sec = 0, .tv_usec = 200000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

static void addr_text(const struct sockaddr_storage *ss, char *out, size_t cap, uint16_t *port) {
  out[0] = '\0';
  *port = 0;
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)ss;
    inet_ntop(AF_INET, &in->sin_addr, out, (socklen_t)cap);
    *port = ntohs(in->sin_port);
  } else if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)ss;
    inet_ntop(AF_INET6, &in6->sin6_addr, out, (socklen_t)cap);
    *port = ntohs(in6->sin6_port);
  }
}

static void note_ends(orch_linktest *lt, int fd) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) addr_text(&ss, lt->local_addr, sizeof lt->local_addr, &lt->local_port);
  sl = sizeof ss;
  if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) addr_text(&ss, lt->peer_addr, sizeof lt->peer_addr, &lt->peer_port);
}

/* HMAC(token, label || a || b) */
static void auth_mac(const orch_linktest *lt, const char *label, const uint8_t a[32], const uint8_t b[32], uint8_t out[32]) {
  uint8_t msg[128];
  size_t ll = strlen(label);
  memcpy(msg, label, ll);
  memcpy(msg + ll, a, 32);
  memcpy(msg + ll + 32, b, 32);
  orch_hmac_sha256((const uint8_t *)lt->token, strlen(lt->token), msg, ll + 64, out);
}

static int32_t handshake(orch_linktest *lt, int fd, bool connector) {
  uint8_t ns[32], nc[32], mac[32], want[32], buf[128];
  uint32_t len;
  int32_t rc;
  if (!connector) {
    if (orch_random(ns, 32) != 0) return ORCH_ERR_INTERNAL;
    memcpy(buf, "ORCHLT1\0", 8);
    memcpy(buf + 8, ns, 32);
    if ((rc = lt_send_frame(lt, fd, F_HELLO, buf, 40)) != ORCH_OK) return rc;
    if ((rc = lt_expect_frame(lt, fd, F_AUTH, buf, sizeof buf, &len)) != ORCH_OK) return rc;
    if (len != 64) return ORCH_ERR_PROTOCOL;
    memcpy(nc, buf, 32);
    auth_mac(lt, CLIENT_LABEL, ns, nc, want);
    if (!orch_ct_equal(want, buf + 32, 32)) {
      lt_send_frame(lt, fd, F_AUTH_FAIL, NULL, 0);
      snprintf(lt->err, sizeof lt->err, "peer presented a wrong token");
      return ORCH_ERR_AUTH;
    }
    auth_mac(lt, SERVER_LABEL, nc, ns, mac);
    return lt_send_frame(lt, fd, F_AUTH_OK, mac, 32);
  }
  if ((rc = lt_expect_frame(lt, fd, F_HELLO, buf, sizeof buf, &len)) != ORCH_OK) return rc;
  if (len != 40 || memcmp(buf, "ORCHLT1\0", 8) != 0) {
    snprintf(lt->err, sizeof lt->err, "not an orchard-linktest listener");
    return ORCH_ERR_PROTOCOL;
  }
  memcpy(ns, buf + 8, 32);
  if (orch_random(nc, 32) != 0) return ORCH_ERR_INTERNAL;
  auth_mac(lt, CLIENT_LABEL, ns, nc, mac);
  memcpy(buf, nc, 32);
  memcpy(buf + 32, mac, 32);
  if ((rc = lt_send_frame(lt, fd, F_AUTH, buf, 64)) != ORCH_OK) return rc;
  uint32_t type;
  if ((rc = lt_recv_frame(lt, fd, &type, buf, sizeof buf, &len)) != ORCH_OK) return rc;
  if (type == F_AUTH_FAIL) {
    snprintf(lt->err, sizeof lt->err, "the listener refused the control token");
    return ORCH_ERR_AUTH;
  }
  auth_mac(lt, SERVER_LABEL, nc, ns, want);
  if (type != F_AUTH_OK || len != 32 || !orch_ct_equal(want, buf, 32)) {
    snprintf(lt->err, sizeof lt->err, "the listener did not prove it knows the token");
    return ORCH_ERR_AUTH;
  }
  return ORCH_OK;
}

static void encode_caps(const orch_linktest *lt, uint8_t *b, bool rdma_ok, const char *dev, const char *reason) {
  memset(b, 0, CAPS_LEN);
  put32(b, 1);
  put32(b + 4, (uint32_t)lt->transport);
  put32(b + 8, lt->p.iterations), put32(b + 12, lt->p.warmup), put32(b + 16, lt->p.msg_bytes);
  put32(b + 20, lt->p.bw_msg_bytes), put64(b + 24, lt->p.bw_bytes);
  b[32] = rdma_ok;
  orch_copy((char *)b + 34, 64, dev);
  orch_copy((char *)b + 98, 128, reason);
  char host[64] = "";
  gethostname(host, sizeof host - 1);
  orch_copy((char *)b + 226, 64, host);
  orch_copy((char *)b + 290, 16, ORCH_VERSION_STRING);
}

/* Runs the whole session on an authenticated control socket. */
static int32_t session(orch_linktest *lt, int fd, bool connector, lt_stats *s, lt_params *p, char *transport,
                       size_t tcap, char *fallback, size_t fcap, char *rdma_dev, int *gid_index) {
  char dev[64] = "", reason[256] = "";
  bool rdma_ok = false;
  if (lt->transport == LT_TCP) snprintf(reason, sizeof reason, "transport tcp requested");
  else rdma_ok = rdma_find_port(lt->device[0] ? lt->device : NULL, dev, sizeof dev, reason, sizeof reason);
  uint8_t mine[CAPS_LEN], theirs[CAPS_LEN];
  encode_caps(lt, mine, rdma_ok, dev, reason);
  uint32_t len;
  int32_t rc;
  if (connector) {
    if ((rc = lt_send_frame(lt, fd, F_CAPS, mine, CAPS_LEN)) != ORCH_OK) return rc;
    if ((rc = lt_expect_frame(lt, fd, F_CAPS, theirs, CAPS_LEN, &len)) != ORCH_OK) return rc;
  } else {
    if ((rc = lt_expect_frame(lt, fd, F_CAPS, theirs, CAPS_LEN, &len)) != ORCH_OK) return rc;
    if ((rc = lt_send_frame(lt, fd, F_CAPS, mine, CAPS_LEN)) != ORCH_OK) return rc;
  }
  if (len != CAPS_LEN || get32(theirs) != 1) {
    snprintf(lt->err, sizeof lt->err, "peer speaks an unknown link test protocol version");
    return ORCH_ERR_PROTOCOL;
  }
  theirs[97] = theirs[225] = theirs[289] = theirs[305] = 0;
  lt->have_peer = true;
  lt->peer_rdma = theirs[32] != 0;
  orch_copy(lt->peer_reason, sizeof lt->peer_reason, (const char *)theirs + 98);
  orch_copy(lt->peer_host, sizeof lt->peer_host, (const char *)theirs + 226);
  orch_copy(lt->peer_version, sizeof lt->peer_version, (const char *)theirs + 290);
  /* The connector's parameters rule; the listener bounds them. */
  const uint8_t *cp = connector ? mine : theirs;
  p->iterations = get32(cp + 8), p->warmup = get32(cp + 12), p->msg_bytes = get32(cp + 16);
  p->bw_msg_bytes = get32(cp + 20), p->bw_bytes = get64(cp + 24);
  if (p->iterations < 1 || p->iterations > 1000000 || p->warmup > 100000 || p->msg_bytes < LT_HDR ||
      p->msg_bytes > MAX_MSG_BYTES || p->bw_msg_bytes < 64 || p->bw_msg_bytes > MAX_BW_MSG_BYTES ||
      p->bw_bytes > (1ull << 36)) {
    snprintf(lt->err, sizeof lt->err, "link test parameters out of range");
    return ORCH_ERR_PROTOCOL;
  }
  int peer_transport = (int)get32(theirs + 4);
  bool force_rdma = lt->transport == LT_RDMA || peer_transport == LT_RDMA;
  bool want_rdma = lt->transport != LT_TCP && peer_transport != LT_TCP;
  fallback[0] = '\0';
  if (want_rdma && rdma_ok && lt->peer_rdma) {
    bool can_fallback = true, uc = false;
    char why[256] = "";
    rc = lt_rdma_run(lt, fd, connector, p, s, rdma_dev, 64, gid_index, &uc, &can_fallback, why, sizeof why);
    if (rc == ORCH_OK) {
      orch_copy(transport, tcap, uc ? "rdma-uc" : "rdma-rc");
      return ORCH_OK;
    }
    if (!can_fallback || force_rdma || rc == ORCH_ERR_CANCELLED || rc == ORCH_ERR_TIMEOUT) {
      snprintf(lt->err, sizeof lt->err, "RDMA link test failed: %s", why);
      return rc;
    }
    snprintf(fallback, fcap, "RDMA setup failed: %s", why);
    memset(s, 0, sizeof *s);
  } else if (!want_rdma) {
    snprintf(fallback, fcap, "transport tcp requested");
  } else if (!rdma_ok) {
    snprintf(fallback, fcap, "this node: %s", reason);
  } else {
    snprintf(fallback, fcap, "peer: %s", lt->peer_reason);
  }
  if (force_rdma && want_rdma) {
    snprintf(lt->err, sizeof lt->err, "transport rdma required but unavailable (%s)", fallback);
    return ORCH_ERR_UNAVAILABLE;
  }
  orch_copy(transport, tcap, "tcp");
  if ((rc = tcp_latency(lt, fd, connector, p, s)) != ORCH_OK) return rc;
  if ((rc = tcp_bandwidth(lt, fd, connector, p, s)) != ORCH_OK) return rc;
  return lt_exchange_results(lt, fd, connector, s);
}

static const char *status_word(int32_t rc) {
  switch (rc) {
    case ORCH_OK: return "ok";
    case ORCH_ERR_CANCELLED: return "cancelled";
    case ORCH_ERR_TIMEOUT: return "timeout";
    case ORCH_ERR_AUTH: return "auth_failed";
    default: return "failed";
  }
}

static void build_result(orch_linktest *lt, bool connector, int32_t rc, uint64_t started_ms, uint64_t t0,
                         const lt_params *p, const lt_stats *s, const char *transport, const char *fallback,
                         const char *rdma_dev, int gid_index) {
  jbuf b;
  jb_init(&b);
  jb_obj_open(&b);
  jb_key(&b, "schema"); jb_str(&b, "orchard.linktest/1");
  jb_key(&b, "role"); jb_str(&b, connector ? "connector" : "listener");
  jb_key(&b, "status"); jb_str(&b, status_word(rc));
  jb_key(&b, "error");
  if (rc == ORCH_OK) jb_null(&b);
  else if (lt->err[0]) jb_str(&b, lt->err);
  else jb_str(&b, orch_status_str(rc));
  jb_key(&b, "transport"); jb_str(&b, transport && transport[0] ? transport : NULL);
  jb_key(&b, "fallback_reason"); jb_str(&b, fallback && fallback[0] ? fallback : NULL);
  jb_key(&b, "rdma");
  if (rdma_dev && rdma_dev[0]) {
    jb_obj_open(&b);
    jb_key(&b, "device"); jb_str(&b, rdma_dev);
    jb_key(&b, "gid_index"); jb_int(&b, gid_index);
    jb_obj_close(&b);
  } else {
    jb_null(&b);
  }
  jb_key(&b, "local");
  jb_obj_open(&b);
  char host[64] = "";
  gethostname(host, sizeof host - 1);
  jb_key(&b, "hostname"); jb_str(&b, host);
  jb_key(&b, "address"); jb_str(&b, lt->local_addr[0] ? lt->local_addr : NULL);
  jb_key(&b, "port"); if (lt->local_port) jb_uint(&b, lt->local_port); else jb_null(&b);
  jb_key(&b, "liborchard"); jb_str(&b, ORCH_VERSION_STRING);
  jb_obj_close(&b);
  jb_key(&b, "peer");
  if (lt->peer_addr[0] || lt->have_peer) {
    jb_obj_open(&b);
    jb_key(&b, "hostname"); jb_str(&b, lt->have_peer ? lt->peer_host : NULL);
    jb_key(&b, "address"); jb_str(&b, lt->peer_addr[0] ? lt->peer_addr : NULL);
    jb_key(&b, "port"); if (lt->peer_port) jb_uint(&b, lt->peer_port); else jb_null(&b);
    jb_key(&b, "liborchard"); jb_str(&b, lt->have_peer ? lt->peer_version : NULL);
    jb_key(&b, "rdma_available"); if (lt->have_peer) jb_bool(&b, lt->peer_rdma); else jb_null(&b);
    jb_key(&b, "rdma_reason"); jb_str(&b, lt->have_peer && !lt->peer_rdma ? lt->peer_reason : NULL);
    jb_obj_close(&b);
  } else {
    jb_null(&b);
  }
  jb_key(&b, "params");
  jb_obj_open(&b);
  jb_key(&b, "iterations"); jb_uint(&b, p->iterations);
  jb_key(&b, "warmup"); jb_uint(&b, p->warmup);
  jb_key(&b, "msg_bytes"); jb_uint(&b, p->msg_bytes);
  jb_key(&b, "bw_bytes"); jb_uint(&b, p->bw_bytes);
  jb_key(&b, "bw_msg_bytes"); jb_uint(&b, p->bw_msg_bytes);
  jb_key(&b, "timeout_ms"); jb_uint(&b, lt->timeout_ms);
  jb_obj_close(&b);
  jb_key(&b, "latency");
  if (rc == ORCH_OK && s->have_latency) {
    jb_obj_open(&b);
    jb_key(&b, "samples"); jb_uint(&b, s->samples);
    jb_key(&b, "rtt_us");
    jb_obj_open(&b);
    jb_key(&b, "min"); jb_num(&b, s->rtt_min_us);
    jb_key(&b, "p50"); jb_num(&b, s->rtt_p50_us);
    jb_key(&b, "p99"); jb_num(&b, s->rtt_p99_us);
    jb_key(&b, "max"); jb_num(&b, s->rtt_max_us);
    jb_key(&b, "mean"); jb_num(&b, s->rtt_mean_us);
    jb_obj_close(&b);
    jb_key(&b, "one_way_us");
    jb_obj_open(&b);
    jb_key(&b, "min"); jb_num(&b, s->rtt_min_us / 2);
    jb_key(&b, "p50"); jb_num(&b, s->rtt_p50_us / 2);
    jb_key(&b, "p99"); jb_num(&b, s->rtt_p99_us / 2);
    jb_key(&b, "max"); jb_num(&b, s->rtt_max_us / 2);
    jb_obj_close(&b);
    jb_obj_close(&b);
  } else {
    jb_null(&b);
  }
  jb_key(&b, "bandwidth");
  if (rc == ORCH_OK && s->have_bandwidth) {
    double secs = (double)s->bw_ns / 1e9;
    jb_obj_open(&b);
    jb_key(&b, "bytes"); jb_uint(&b, s->bw_bytes);
    jb_key(&b, "seconds"); jb_num(&b, secs);
    jb_key(&b, "bytes_per_sec"); jb_num(&b, (double)s->bw_bytes / secs);
    jb_key(&b, "gbit_per_sec"); jb_num(&b, (double)s->bw_bytes * 8 / secs / 1e9);
    jb_key(&b, "measured_by"); jb_str(&b, "receiver");
    jb_obj_close(&b);
  } else {
    jb_null(&b);
  }
  jb_key(&b, "messages");
  jb_obj_open(&b);
  jb_key(&b, "sent"); jb_uint(&b, s->lat_sent + s->bw_sent);
  jb_key(&b, "received"); jb_uint(&b, s->lat_received + s->bw_received);
  jb_key(&b, "lost"); jb_uint(&b, s->lat_lost + s->bw_lost);
  jb_key(&b, "corrupt"); jb_uint(&b, s->lat_corrupt + s->bw_corrupt);
  jb_obj_close(&b);
  jb_key(&b, "refused_connections"); jb_uint(&b, lt->refused);
  jb_key(&b, "started_at_ms"); jb_uint(&b, started_ms);
  jb_key(&b, "duration_ms"); jb_num(&b, (double)(orch_now_ns() - t0) / 1e6);
  jb_obj_close(&b);
  free(lt->result);
  lt->result = jb_take(&b);
  lt->result_len = lt->result ? strlen(lt->result) : 0;
}

static int32_t run_on(orch_linktest *lt, int fd, bool connector, uint64_t started_ms, uint64_t t0) {
  lt_stats s;
  memset(&s, 0, sizeof s);
  lt_params p = lt->p;
  char transport[16] = "", fallback[320] = "", rdma_dev[64] = "";
  int gid_index = -1;
  note_ends(lt, fd);
  int32_t rc = session(lt, fd, connector, &s, &p, transport, sizeof transport, fallback, sizeof fallback, rdma_dev,
                       &gid_index);
  if (rc != ORCH_OK && rc != ORCH_ERR_CANCELLED && rc != ORCH_ERR_IO) {
    char msg[200];
    orch_copy(msg, sizeof msg, lt->err[0] ? lt->err : orch_status_str(rc));
    lt_send_frame(lt, fd, F_ERROR, msg, (uint32_t)strlen(msg));
  }
  build_result(lt, connector, rc, started_ms, t0, &p, &s, transport, fallback, rdma_dev, gid_index);
  return rc;
}

static void begin(orch_linktest *lt) {
  lt->deadline_ns = orch_now_ns() + (uint64_t)lt->timeout_ms * 1000000ull;
  lt->err[0] = '\0';
  lt->refused = 0;
  lt->have_peer = false;
  lt->peer_addr[0] = lt->local_addr[0] = '\0';
  lt->peer_port = lt->local_port = 0;
}

/* Waits for fd events or cancel; ORCH_OK when ready. */
static int32_t wait_fd(orch_linktest *lt, int fd, short events) {
  for (;;) {
    int32_t why;
    if (lt_should_stop(lt, &why)) return why;
    uint64_t left = (lt->deadline_ns - orch_now_ns()) / 1000000ull + 1;
    struct pollfd pf[2] = {{.fd = fd, .events = events}, {.fd = lt->cancel_pipe[0], .events = POLLIN}};
    int r = poll(pf, 2, left > 1000 ? 1000 : (int)left);
    if (r < 0 && errno != EINTR) return ORCH_ERR_IO;
    if (r > 0 && (pf[0].revents & (events | POLLERR | POLLHUP))) return ORCH_OK;
  }
}

ORCH_API int32_t orch_linktest_listen(orch_linktest *lt, const char *host, uint16_t port) {
  if (!lt) return ORCH_ERR_INVALID_ARG;
  if (lt->listen_fd >= 0) return ORCH_ERR_STATE;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
  char ps[8];
  snprintf(ps, sizeof ps, "%u", port);
  if (getaddrinfo(host && host[0] ? host : "0.0.0.0", ps, &hints, &ai) != 0 || !ai) return ORCH_ERR_INVALID_ARG;
  int fd = socket(ai->ai_family, SOCK_STREAM, 0);
  int one = 1;
  if (fd >= 0) {
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  }
  if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 4) != 0) {
    int32_t rc = errno == EADDRINUSE ? ORCH_ERR_BUSY : ORCH_ERR_IO;
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    return rc;
  }
  freeaddrinfo(ai);
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  char tmp[64];
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) addr_text(&ss, tmp, sizeof tmp, &lt->port);
  lt->listen_fd = fd;
  return ORCH_OK;
}

ORCH_API int32_t orch_linktest_accept_run(orch_linktest *lt) {
  if (!lt) return ORCH_ERR_INVALID_ARG;
  if (lt->listen_fd < 0 || !lt->token[0]) return ORCH_ERR_STATE;
  uint64_t started = orch_wall_ms(), t0 = orch_now_ns();
  begin(lt);
  lt_params p = lt->p;
  lt_stats s;
  memset(&s, 0, sizeof s);
  for (;;) {
    int32_t rc = wait_fd(lt, lt->listen_fd, POLLIN);
    if (rc != ORCH_OK) {
      if (rc == ORCH_ERR_TIMEOUT) snprintf(lt->err, sizeof lt->err, "no authenticated peer within %u ms", lt->timeout_ms);
      build_result(lt, false, rc, started, t0, &p, &s, NULL, NULL, NULL, -1);
      return rc;
    }
    int fd = accept(lt->listen_fd, NULL, NULL);
    if (fd < 0) continue;
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    sock_setup(fd);
    atomic_store(&lt->data_fd, fd);
    if (atomic_load(&lt->cancelled)) shutdown(fd, SHUT_RDWR);
    note_ends(lt, fd);
    /* A peer gets at most 5 s to authenticate so it cannot hold the listener. */
    uint64_t real_deadline = lt->deadline_ns, hs = orch_now_ns() + 5000000000ull;
    if (hs < lt->deadline_ns) lt->deadline_ns = hs;
    rc = handshake(lt, fd, false);
    lt->deadline_ns = real_deadline;
    if (rc == ORCH_OK) {
      rc = run_on(lt, fd, false, started, t0);
      atomic_store(&lt->data_fd, -1);
      close(fd);
      close(lt->listen_fd);
      lt->listen_fd = -1;
      return rc;
    }
    atomic_store(&lt->data_fd, -1);
    close(fd);
    if (rc == ORCH_ERR_CANCELLED) {
      build_result(lt, false, rc, started, t0, &p, &s, NULL, NULL, NULL, -1);
      return rc;
    }
    lt->refused++; /* wrong token or garbage: keep waiting for the real peer */
    lt->err[0] = '\0';
  }
}

ORCH_API int32_t orch_linktest_connect_run(orch_linktest *lt, const char *host, uint16_t port) {
  if (!lt || !host || !host[0] || port == 0) return ORCH_ERR_INVALID_ARG;
  if (!lt->token[0]) return ORCH_ERR_STATE;
  uint64_t started = orch_wall_ms(), t0 = orch_now_ns();
  begin(lt);
  lt_params p = lt->p;
  lt_stats s;
  memset(&s, 0, sizeof s);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  char ps[8];
  snprintf(ps, sizeof ps, "%u", port);
  if (getaddrinfo(host, ps, &hints, &ai) != 0 || !ai) {
    snprintf(lt->err, sizeof lt->err, "cannot resolve %s", host);
    build_result(lt, true, ORCH_ERR_INVALID_ARG, started, t0, &p, &s, NULL, NULL, NULL, -1);
    return ORCH_ERR_INVALID_ARG;
  }
  int fd = socket(ai->ai_family, SOCK_STREAM, 0);
  int32_t rc = fd < 0 ? ORCH_ERR_IO : ORCH_OK;
  if (rc == ORCH_OK) {
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) rc = ORCH_ERR_IO;
    if (rc == ORCH_OK) rc = wait_fd(lt, fd, POLLOUT);
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (rc == ORCH_OK && (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0)) rc = ORCH_ERR_IO;
    if (rc == ORCH_ERR_IO) snprintf(lt->err, sizeof lt->err, "cannot connect to %s:%u: %s", host, port, strerror(soerr ? soerr : errno));
  }
  freeaddrinfo(ai);
  if (rc == ORCH_OK) {
    fcntl(fd, F_SETFL, 0);
    sock_setup(fd);
    atomic_store(&lt->data_fd, fd);
    if (atomic_load(&lt->cancelled)) shutdown(fd, SHUT_RDWR);
    note_ends(lt, fd);
    rc = handshake(lt, fd, true);
    if (rc == ORCH_OK) rc = run_on(lt, fd, true, started, t0);
    else build_result(lt, true, rc, started, t0, &p, &s, NULL, NULL, NULL, -1);
    atomic_store(&lt->data_fd, -1);
  } else {
    build_result(lt, true, rc, started, t0, &p, &s, NULL, NULL, NULL, -1);
  }
  if (fd >= 0) close(fd);
  return rc;
}
