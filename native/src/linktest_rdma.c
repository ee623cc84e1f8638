/* RDMA phases of the link test: UC (Apple Thunderbolt) or RC (rdma-core) SEND/RECV ping-pong
 * and a credit-paced stream timed by the receiver. QP facts travel over the TCP control
 * connection; RTR/RTS is attempted once. Every receive is posted with the length of the
 * matching send (Apple needs equal 4 KiB frame counts), and each side posts exactly as many
 * receives per phase as it will consume, so no stale receive survives into the next phase. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "linktest_int.h"
#include "rdma.h"

#define RDMA_DEPTH 64u
#define RDMA_MAX_SLOT (64u * 1024u)
#define LAT_WAIT_NS 100000000ull  /* a ping unanswered for 100 ms counts as lost */
#define CREDIT_WAIT_NS 200000000ull

typedef struct recv_plan {
  uint64_t total;  /* receives this side will consume in the phase */
  uint64_t posted;
  uint32_t len;
} recv_plan;

/* A failed work completion, in words. */
static int32_t wc_failed(orch_linktest *lt, const rdma_completion *c) {
  snprintf(lt->err, sizeof lt->err, "%s completion failed: %s (status %d)", c->is_recv ? "receive" : "send",
           rdma_wc_status_str(c->status), c->status);
  return ORCH_ERR_IO;
}

/* The control connection went quiet-then-closed while completions were awaited. */
static int32_t peer_gone(orch_linktest *lt, const char *phase) {
  snprintf(lt->err, sizeof lt->err, "peer disappeared mid-test (control connection closed during the RDMA %s phase)",
           phase);
  return ORCH_ERR_IO;
}

static int32_t plan_start(rdma_ep *ep, recv_plan *rp, uint64_t total, uint32_t len) {
  rp->total = total, rp->posted = 0, rp->len = len;
  uint32_t depth = rdma_ep_depth(ep);
  for (uint32_t i = 0; i < depth && rp->posted < total; i++, rp->posted++) {
    int32_t rc = rdma_ep_post_recv(ep, i, len);
    if (rc != ORCH_OK) return rc;
  }
  return ORCH_OK;
}

static int32_t plan_repost(rdma_ep *ep, recv_plan *rp, uint32_t slot) {
  if (rp->posted >= rp->total) return ORCH_OK;
  rp->posted++;
  return rdma_ep_post_recv(ep, slot, rp->len);
}

static void enc_info(uint8_t *b, bool ok, const char *reason, const rdma_info *i) {
  memset(b, 0, 180);
  b[0] = ok;
  orch_copy((char *)b + 1, 128, reason);
  put32(b + 129, i->qpn), put32(b + 133, i->psn), put32(b + 137, i->lid);
  memcpy(b + 141, i->gid, 16);
  b[157] = i->mtu, b[158] = i->uc;
  put32(b + 159, i->depth), put32(b + 163, i->slot_bytes);
}

static void dec_info(const uint8_t *b, rdma_info *i) {
  i->qpn = get32(b + 129), i->psn = get32(b + 133), i->lid = (uint16_t)get32(b + 137);
  memcpy(i->gid, b + 141, 16);
  i->mtu = b[157], i->uc = b[158];
  i->depth = get32(b + 159), i->slot_bytes = get32(b + 163);
}

/* Exchanges a (ok, reason) pair plus payload; connector sends first. */
static int32_t swap(orch_linktest *lt, int fd, bool connector, uint32_t type, uint8_t *mine, uint8_t *theirs,
                    uint32_t len) {
  uint32_t got = 0;
  int32_t rc;
  if (connector) {
    rc = lt_send_frame(lt, fd, type, mine, len);
    if (rc == ORCH_OK) rc = lt_expect_frame(lt, fd, type, theirs, len, &got);
  } else {
    rc = lt_expect_frame(lt, fd, type, theirs, len, &got);
    if (rc == ORCH_OK) rc = lt_send_frame(lt, fd, type, mine, len);
  }
  if (rc == ORCH_OK && got != len) rc = ORCH_ERR_PROTOCOL;
  theirs[128] = 0;
  return rc;
}

static int32_t phase_done(orch_linktest *lt, int fd, bool connector, uint64_t *sent) {
  uint8_t b[8];
  uint32_t len;
  if (connector) {
    put64(b, *sent);
    return lt_send_frame(lt, fd, F_PHASE_DONE, b, 8);
  }
  int32_t rc = lt_expect_frame(lt, fd, F_PHASE_DONE, b, 8, &len);
  if (rc == ORCH_OK) *sent = get64(b);
  return rc;
}

static int32_t latency(orch_linktest *lt, rdma_ep *ep, int fd, bool connector, const lt_params *p, lt_stats *s,
                       uint64_t *rtt) {
  uint64_t total = (uint64_t)p->warmup + p->iterations, n = 0;
  uint32_t depth = rdma_ep_depth(ep), m = p->msg_bytes;
  recv_plan rp;
  int32_t rc = plan_start(ep, &rp, total, m), why;
  rdma_completion wc[16];
  if (rc != ORCH_OK) return rc;
  uint8_t ready[4] = {0};
  uint32_t len;
  /* both sides have their receives posted before the first ping */
  if (connector) rc = lt_expect_frame(lt, fd, F_READY, ready, 4, &len);
  else rc = lt_send_frame(lt, fd, F_READY, ready, 4);
  if (rc != ORCH_OK) return rc;
  if (connector) {
    for (uint64_t i = 0; i < total; i++) {
      uint32_t slot = (uint32_t)(i % depth);
      lt_fill(rdma_ep_buf(ep, true, slot), m, (uint32_t)i);
      uint64_t t0 = orch_now_ns();
      if ((rc = rdma_ep_post_send(ep, slot, m)) != ORCH_OK) return rc;
      s->lat_sent++;
      bool got = false;
      for (uint64_t spins = 0; !got; spins++) {
        int k = rdma_ep_poll(ep, wc, 16);
        if (k < 0) return k;
        for (int j = 0; j < k; j++) {
          if (!wc[j].ok) return wc_failed(lt, &wc[j]);
          if (!wc[j].is_recv) continue;
          uint32_t seq = 0;
          uint64_t t1 = orch_now_ns();
          s->lat_received++;
          bool intact = lt_check(rdma_ep_buf(ep, false, wc[j].slot), m, &seq);
          if ((rc = plan_repost(ep, &rp, wc[j].slot)) != ORCH_OK) return rc;
          if (!intact) {
            s->lat_corrupt++;
          } else if (seq == (uint32_t)i) {
            got = true;
            if (i >= p->warmup) rtt[n++] = t1 - t0;
          } else if (s->lat_lost) {
            s->lat_lost--; /* a late echo of a ping already counted lost */
          }
        }
        if (!got && (spins & 1023) == 1023) {
          if (lt_should_stop(lt, &why)) return why;
          /* the listener writes nothing on the control connection in this phase: readable = gone */
          if (lt_fd_readable(fd)) return peer_gone(lt, "latency");
          if (orch_now_ns() - t0 > LAT_WAIT_NS) {
            s->lat_lost++;
            break;
          }
        }
      }
    }
    lt_rtt_stats(rtt, n, s);
    return phase_done(lt, fd, true, &s->lat_sent);
  }
  uint64_t expect = 0, sends = 0;
  for (uint64_t spins = 0; s->lat_received < total; spins++) {
    int k = rdma_ep_poll(ep, wc, 16);
    if (k < 0) return k;
    for (int j = 0; j < k; j++) {
      if (!wc[j].ok) return wc_failed(lt, &wc[j]);
      if (!wc[j].is_recv) continue;
      uint8_t *in = rdma_ep_buf(ep, false, wc[j].slot);
      uint32_t seq = 0, slot = (uint32_t)(sends++ % depth);
      s->lat_received++;
      if (!lt_check(in, m, &seq)) s->lat_corrupt++;
      else if (seq >= expect) s->lat_lost += seq - expect, expect = seq + 1;
      memcpy(rdma_ep_buf(ep, true, slot), in, m);
      if ((rc = plan_repost(ep, &rp, wc[j].slot)) != ORCH_OK) return rc;
      if ((rc = rdma_ep_post_send(ep, slot, m)) != ORCH_OK) return rc;
      s->lat_sent++;
    }
    if ((spins & 1023) == 1023) {
      if (lt_should_stop(lt, &why)) return why;
      if (lt_fd_readable(fd)) break; /* the connector finished: the rest was lost */
    }
  }
  uint64_t peer_sent = 0;
  rc = phase_done(lt, fd, false, &peer_sent);
  if (rc == ORCH_OK && peer_sent > s->lat_received + s->lat_lost) s->lat_lost = peer_sent - s->lat_received;
  return rc;
}

static int32_t bandwidth(orch_linktest *lt, rdma_ep *ep, int fd, bool connector, const lt_params *p, lt_stats *s,
                         uint32_t bw_slot) {
  uint32_t depth = rdma_ep_depth(ep), m = p->msg_bytes;
  uint64_t count = p->bw_bytes / bw_slot;
  uint32_t batch = depth / 2 ? depth / 2 : 1;
  uint64_t credit_msgs = count / batch;
  recv_plan rp;
  rdma_completion wc[16];
  int32_t rc, why;
  uint8_t ready[4] = {0};
  uint32_t len;
  if (count == 0) return ORCH_OK;
  if (connector) {
    if ((rc = plan_start(ep, &rp, credit_msgs, m)) != ORCH_OK) return rc;
    if ((rc = lt_expect_frame(lt, fd, F_READY, ready, 4, &len)) != ORCH_OK) return rc;
    uint64_t credits = count < depth ? count : depth, inflight = 0, t_wait = 0;
    for (uint32_t i = 0; i < depth; i++) memset(rdma_ep_buf(ep, true, i), 0x5a, bw_slot);
    while (s->bw_sent < count) {
      while (credits > 0 && inflight < depth && s->bw_sent < count) {
        uint32_t slot = (uint32_t)(s->bw_sent % depth);
        uint8_t *b = rdma_ep_buf(ep, true, slot);
        put64(b, s->bw_sent), put64(b + 8, ~s->bw_sent), put64(b + bw_slot - 8, s->bw_sent);
        if ((rc = rdma_ep_post_send(ep, slot, bw_slot)) != ORCH_OK) return rc;
        s->bw_sent++, credits--, inflight++;
        t_wait = 0;
      }
      int k = rdma_ep_poll(ep, wc, 16);
      if (k < 0) return k;
      for (int j = 0; j < k; j++) {
        if (!wc[j].ok) return wc_failed(lt, &wc[j]);
        if (!wc[j].is_recv) {
          inflight--;
          continue;
        }
        credits += get32(rdma_ep_buf(ep, false, wc[j].slot));
        if ((rc = plan_repost(ep, &rp, wc[j].slot)) != ORCH_OK) return rc;
      }
      if (k == 0 && credits == 0) {
        uint64_t now = orch_now_ns();
        if (!t_wait) t_wait = now;
        if (lt_should_stop(lt, &why)) return why;
        if (lt_fd_readable(fd)) return peer_gone(lt, "bandwidth");
        if (now - t_wait > CREDIT_WAIT_NS) credits = batch, t_wait = 0; /* a credit was lost (UC) */
      }
    }
    return phase_done(lt, fd, true, &s->bw_sent);
  }
  if ((rc = plan_start(ep, &rp, count, bw_slot)) != ORCH_OK) return rc;
  if ((rc = lt_send_frame(lt, fd, F_READY, ready, 4)) != ORCH_OK) return rc;
  uint64_t expect = 0, t_first = 0, t_last = 0, since_credit = 0, credit_sends = 0;
  for (uint64_t spins = 0; s->bw_received < count; spins++) {
    int k = rdma_ep_poll(ep, wc, 16);
    if (k < 0) return k;
    for (int j = 0; j < k; j++) {
      if (!wc[j].ok) return wc_failed(lt, &wc[j]);
      if (!wc[j].is_recv) continue;
      t_last = orch_now_ns();
      if (!s->bw_received) t_first = t_last;
      s->bw_received++;
      const uint8_t *b = rdma_ep_buf(ep, false, wc[j].slot);
      uint64_t seq = get64(b);
      if (wc[j].bytes != bw_slot || get64(b + 8) != ~seq || get64(b + bw_slot - 8) != seq) s->bw_corrupt++;
      else if (seq >= expect) s->bw_lost += seq - expect, expect = seq + 1;
      if ((rc = plan_repost(ep, &rp, wc[j].slot)) != ORCH_OK) return rc;
      if (++since_credit == batch && credit_sends < credit_msgs) {
        uint32_t slot = (uint32_t)(credit_sends++ % depth);
        uint8_t *c = rdma_ep_buf(ep, true, slot);
        memset(c, 0, m);
        put32(c, batch);
        if ((rc = rdma_ep_post_send(ep, slot, m)) != ORCH_OK) return rc;
        since_credit = 0;
      }
    }
    if ((spins & 1023) == 1023) {
      if (lt_should_stop(lt, &why)) return why;
      if (lt_fd_readable(fd)) break;
    }
  }
  s->bw_bytes = s->bw_received > 1 ? (s->bw_received - 1) * bw_slot : bw_slot;
  s->bw_ns = t_last > t_first ? t_last - t_first : 1;
  s->have_bandwidth = s->bw_received > 0;
  uint64_t peer_sent = 0;
  rc = phase_done(lt, fd, false, &peer_sent);
  if (rc == ORCH_OK && peer_sent > s->bw_received + s->bw_lost) s->bw_lost = peer_sent - s->bw_received;
  return rc;
}

int32_t lt_rdma_run(orch_linktest *lt, int fd, bool connector, const lt_params *p, lt_stats *s, char *device_out,
                    size_t dcap, int *gid_index, bool *uc, bool *fallback, char *reason, size_t rcap) {
  *fallback = true;
  uint32_t bw_slot = p->bw_msg_bytes < RDMA_MAX_SLOT ? p->bw_msg_bytes : RDMA_MAX_SLOT;
  uint32_t slot = p->msg_bytes > bw_slot ? p->msg_bytes : bw_slot;
  rdma_ep *ep = NULL;
  char err[256] = "";
  int32_t rc = rdma_ep_open(lt->device[0] ? lt->device : NULL, lt->gid_index, slot, RDMA_DEPTH, &ep, err, sizeof err);
  rdma_info mine, theirs;
  memset(&mine, 0, sizeof mine);
  if (ep) rdma_ep_local(ep, &mine);
  uint8_t a[180], b[180];
  enc_info(a, ep != NULL, err, &mine);
  int32_t xrc = swap(lt, fd, connector, F_RDMA_INFO, a, b, sizeof a);
  if (xrc != ORCH_OK) {
    rdma_ep_close(ep);
    *fallback = false;
    snprintf(reason, rcap, "control connection failed during RDMA setup");
    return xrc;
  }
  dec_info(b, &theirs);
  if (!ep || !b[0]) {
    snprintf(reason, rcap, "%s: %s", !ep ? "this node" : "peer", !ep ? err : (const char *)b + 1);
    rdma_ep_close(ep);
    return rc != ORCH_OK ? rc : ORCH_ERR_UNAVAILABLE;
  }
  if (theirs.slot_bytes != mine.slot_bytes || theirs.depth == 0) {
    snprintf(reason, rcap, "peer buffers differ (%u/%u bytes)", theirs.slot_bytes, mine.slot_bytes);
    rdma_ep_close(ep);
    return ORCH_ERR_PROTOCOL;
  }
  rc = rdma_ep_connect(ep, &theirs, err, sizeof err);
  enc_info(a, rc == ORCH_OK, err, &mine);
  xrc = swap(lt, fd, connector, F_READY, a, b, sizeof a);
  if (xrc != ORCH_OK || rc != ORCH_OK || !b[0]) {
    snprintf(reason, rcap, "%s", rc != ORCH_OK ? err : xrc != ORCH_OK ? "control connection failed" : (const char *)b + 1);
    rdma_ep_close(ep);
    if (xrc != ORCH_OK) *fallback = false;
    return rc != ORCH_OK ? rc : xrc != ORCH_OK ? xrc : ORCH_ERR_UNAVAILABLE;
  }
  /* From here on a failure is a result, not a reason to fall back. */
  *fallback = false;
  orch_copy(device_out, dcap, rdma_ep_device(ep));
  *gid_index = rdma_ep_gid_index(ep);
  *uc = mine.uc != 0;
  uint64_t *rtt = connector ? calloc(p->iterations, sizeof *rtt) : NULL;
  if (connector && !rtt) rc = ORCH_ERR_NO_MEMORY;
  if (rc == ORCH_OK) rc = latency(lt, ep, fd, connector, p, s, rtt);
  if (rc == ORCH_OK) rc = bandwidth(lt, ep, fd, connector, p, s, bw_slot);
  if (rc == ORCH_OK) rc = lt_exchange_results(lt, fd, connector, s);
  if (rc == ORCH_ERR_IO && (strcmp(lt->err, "peer closed the connection") == 0 || strstr(lt->err, "reset by peer"))) {
    snprintf(lt->err, sizeof lt->err, "peer disappeared mid-test (control connection closed during the RDMA phases)");
  }
  if (rc != ORCH_OK) snprintf(reason, rcap, "%s", lt->err[0] ? lt->err : orch_status_str(rc));
  free(rtt);
  rdma_ep_close(ep);
  return rc;
}
