/* Plain blocking TCP ping-pong and stream: the benchmark's baseline for the link test's TCP
 * path (same message sizes, same receiver-side timing), with nothing else in the loop.
 *   tcp_baseline server            prints the port, serves one client
 *   tcp_baseline client PORT ITER WARMUP MSG BW_BYTES BW_MSG   prints one JSON line */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int full(int fd, void *buf, size_t n, int sending) {
  char *p = buf;
  while (n) {
    ssize_t r = sending ? send(fd, p, n, 0) : recv(fd, p, n, 0);
    if (r <= 0) return -1;
    p += r, n -= (size_t)r;
  }
  return 0;
}

static void tune(int fd) {
  int one = 1, buf = 4 << 20;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

static int cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "server") == 0) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (struct sockaddr *)&a, &al)) return 1;
    printf("%u\n", ntohs(a.sin_port));
    fflush(stdout);
    int fd = accept(ls, NULL, NULL);
    tune(fd);
    uint32_t hdr[5]; /* iterations+warmup, msg, bw count, bw msg, 0 */
    if (full(fd, hdr, sizeof hdr, 0)) return 1;
    char *buf = malloc(hdr[1] > hdr[3] ? hdr[1] : hdr[3]);
    for (uint32_t i = 0; i < hdr[0]; i++) {
      if (full(fd, buf, hdr[1], 0) || full(fd, buf, hdr[1], 1)) return 1;
    }
    uint64_t t_first = 0, t_last = 0;
    for (uint32_t i = 0; i < hdr[2]; i++) {
      if (full(fd, buf, hdr[3], 0)) return 1;
      t_last = now_ns();
      if (i == 0) t_first = t_last;
    }
    uint64_t ns = t_last - t_first;
    full(fd, &ns, sizeof ns, 1);
    close(fd);
    return 0;
  }
  if (argc != 8 || strcmp(argv[1], "client") != 0) {
    fprintf(stderr, "usage: tcp_baseline server | client PORT ITER WARMUP MSG BW_BYTES BW_MSG\n");
    return 2;
  }
  uint32_t iter = (uint32_t)atoi(argv[3]), warm = (uint32_t)atoi(argv[4]), msg = (uint32_t)atoi(argv[5]);
  uint64_t bw_bytes = strtoull(argv[6], NULL, 10);
  uint32_t bw_msg = (uint32_t)atoi(argv[7]);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2])),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) return 1;
  tune(fd);
  uint32_t count = (uint32_t)(bw_bytes / bw_msg);
  uint32_t hdr[5] = {iter + warm, msg, count, bw_msg, 0};
  char *buf = calloc(1, msg > bw_msg ? msg : bw_msg);
  uint64_t *rtt = calloc(iter, sizeof *rtt);
  if (full(fd, hdr, sizeof hdr, 1)) return 1;
  for (uint32_t i = 0; i < iter + warm; i++) {
    uint64_t t0 = now_ns();
    if (full(fd, buf, msg, 1) || full(fd, buf, msg, 0)) return 1;
    if (i >= warm) rtt[i - warm] = now_ns() - t0;
  }
  for (uint32_t i = 0; i < count; i++) {
    if (full(fd, buf, bw_msg, 1)) return 1;
  }
  uint64_t ns = 0;
  if (full(fd, &ns, sizeof ns, 0)) return 1;
  qsort(rtt, iter, sizeof *rtt, cmp);
  double bytes = count > 1 ? (double)(count - 1) * bw_msg : bw_msg;
  printf("{\"rtt_min_us\":%.3f,\"rtt_p50_us\":%.3f,\"rtt_p99_us\":%.3f,\"bytes_per_sec\":%.0f}\n", rtt[0] / 1e3,
         rtt[(iter * 50 + 99) / 100 - 1] / 1e3, rtt[(iter * 99 + 99) / 100 - 1] / 1e3, bytes / ((double)ns / 1e9));
  close(fd);
  return 0;
}
