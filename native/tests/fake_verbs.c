/* TEST DOUBLE: a fake verbs provider standing in for hardware CI cannot have. Built only for
 * tests and selected only through env ORCHARD_VERBS_LIB. It reports Apple-like Thunderbolt
 * devices (transport 100, UC-only, MTU 1024):
 *   rdma_en2: active, only fe80:: GIDs          -> unusable (no IPv4-mapped GID)
 *   rdma_en3: active, IPv4-mapped GID at index 1 -> usable, gid_index 1
 *   rdma_en4: port down                          -> unusable (not active)
 * It exports only the probe's symbols: no queue pairs, so a link test falls back to TCP. */
#include <infiniband/verbs.h>
#include <stdlib.h>
#include <string.h>

#undef ibv_query_port
#undef ibv_get_device_list

#define EXPORT __attribute__((visibility("default")))
#define NDEV 3

static struct ibv_device devs[NDEV];
static struct ibv_device *list[NDEV + 1];

EXPORT struct ibv_device **ibv_get_device_list(int *num) {
  static const char *names[NDEV] = {"rdma_en2", "rdma_en3", "rdma_en4"};
  for (int i = 0; i < NDEV; i++) {
    memset(&devs[i], 0, sizeof devs[i]);
    devs[i].node_type = IBV_NODE_CA;
    devs[i].transport_type = (enum ibv_transport_type)100; /* Apple's value */
    strncpy(devs[i].name, names[i], sizeof devs[i].name - 1);
    list[i] = &devs[i];
  }
  list[NDEV] = NULL;
  if (num) *num = NDEV;
  return list;
}

EXPORT void ibv_free_device_list(struct ibv_device **l) { (void)l; }

EXPORT const char *ibv_get_device_name(struct ibv_device *d) { return d->name; }

EXPORT struct ibv_context *ibv_open_device(struct ibv_device *d) {
  struct ibv_context *c = calloc(1, sizeof *c);
  if (c) c->device = d;
  return c;
}

EXPORT int ibv_close_device(struct ibv_context *c) {
  free(c);
  return 0;
}

EXPORT int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a) {
  (void)c;
  memset(a, 0, sizeof *a);
  strcpy(a->fw_ver, "fake-26.2");
  a->vendor_id = 0x05ac;
  a->vendor_part_id = 0x5;
  a->max_qp = 10;
  a->max_qp_wr = 256;
  a->max_cq = 10;
  a->max_cqe = 512;
  a->max_mr = 100;
  a->max_mr_size = 1ull << 32;
  a->max_sge = 1;
  a->max_pd = 10;
  a->phys_port_cnt = 1;
  return 0;
}

static int dev_index(struct ibv_context *c) { return (int)(c->device - devs); }

/* The exported rdma-core symbol takes the compat struct, a prefix of ibv_port_attr. */
EXPORT int ibv_query_port(struct ibv_context *c, uint8_t port, struct _compat_ibv_port_attr *compat) {
  struct ibv_port_attr *a = (struct ibv_port_attr *)compat;
  if (port != 1) return 22; /* EINVAL */
  memset(a, 0, sizeof *a); /* liborchard passes a full ibv_port_attr */
  a->state = dev_index(c) == 2 ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
  a->phys_state = dev_index(c) == 2 ? 3 : 5;
  a->link_layer = IBV_LINK_LAYER_ETHERNET;
  a->active_mtu = IBV_MTU_1024;
  a->max_mtu = IBV_MTU_4096;
  a->gid_tbl_len = 4;
  a->lid = 0;
  a->active_speed = 0;
  a->active_width = 0;
  return 0;
}

EXPORT int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid) {
  (void)port;
  memset(gid, 0, sizeof *gid);
  int d = dev_index(c);
  if (index == 0 || (index == 1 && d != 1)) {
    gid->raw[0] = 0xfe, gid->raw[1] = 0x80, gid->raw[15] = (uint8_t)(d * 16 + index + 1);
  } else if (index == 1 && d == 1) {
    gid->raw[10] = 0xff, gid->raw[11] = 0xff, gid->raw[12] = 10, gid->raw[15] = 2; /* ::ffff:10.0.0.2 */
  }
  return 0;
}
