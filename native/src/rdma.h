/* Internal RDMA endpoint used by the link test (verbs.c). Not part of the ABI. */
#ifndef ORCH_RDMA_H
#define ORCH_RDMA_H

#include <stdbool.h>
#include <stdint.h>

typedef struct rdma_ep rdma_ep;

/* What each side tells the other over the TCP control connection. */
typedef struct rdma_info {
  uint32_t qpn;
  uint32_t psn;
  uint16_t lid;
  uint8_t gid[16];
  uint8_t mtu;       /* enum ibv_mtu */
  uint8_t uc;        /* 1 = UC (Apple), 0 = RC */
  uint32_t depth;    /* receive slots actually posted (after ibv_query_qp) */
  uint32_t slot_bytes;
} rdma_info;

typedef struct rdma_completion {
  uint32_t slot;
  uint32_t bytes;
  bool is_recv;
  bool ok;
  int status; /* enum ibv_wc_status */
} rdma_completion;

/* Words for a work-completion status (ibv_wc_status_str without linking libibverbs). */
const char *rdma_wc_status_str(int status);

/* Finds a usable device/port (device NULL = first usable) without opening a QP. */
bool rdma_find_port(const char *device, char *dev_out, size_t dev_cap, char *reason, size_t cap);
/* Opens device, PD, CQ, one MR and a UC (Apple) or RC (Linux) QP in INIT. */
int32_t rdma_ep_open(const char *device, int gid_index, uint32_t slot_bytes, uint32_t depth, rdma_ep **out,
                     char *err, size_t cap);
void rdma_ep_local(const rdma_ep *ep, rdma_info *out);
/* RTR then RTS, exactly once (never retried: repeated failures wedge Apple ports). */
int32_t rdma_ep_connect(rdma_ep *ep, const rdma_info *remote, char *err, size_t cap);
int32_t rdma_ep_post_recv(rdma_ep *ep, uint32_t slot, uint32_t len);
int32_t rdma_ep_post_send(rdma_ep *ep, uint32_t slot, uint32_t len);
/* Polls up to max completions; returns the count or a negative status. */
int rdma_ep_poll(rdma_ep *ep, rdma_completion *out, int max);
uint8_t *rdma_ep_buf(rdma_ep *ep, bool send, uint32_t slot);
uint32_t rdma_ep_depth(const rdma_ep *ep);
const char *rdma_ep_device(const rdma_ep *ep);
int rdma_ep_gid_index(const rdma_ep *ep);
void rdma_ep_close(rdma_ep *ep);

#endif
