/* Network interfaces through getifaddrs (Linux and macOS). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#if defined(__APPLE__)
#include <net/if_dl.h>
#else
#include <netpacket/packet.h>
#endif

#include "internal.h"

#define MAX_IFACES 64

static int iface_mtu(const char *name) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return -1;
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  orch_copy(ifr.ifr_name, sizeof ifr.ifr_name, name);
  int mtu = ioctl(fd, SIOCGIFMTU, &ifr) == 0 ? ifr.ifr_mtu : -1;
  close(fd);
  return mtu;
}

static void write_iface(jbuf *b, struct ifaddrs *all, const char *name) {
  unsigned flags = 0;
  char mac[32] = "";
  for (struct ifaddrs *a = all; a; a = a->ifa_next) {
    if (strcmp(a->ifa_name, name) != 0) continue;
    flags |= a->ifa_flags;
    if (!a->ifa_addr) continue;
#if defined(__APPLE__)
    if (a->ifa_addr->sa_family == AF_LINK) {
      const struct sockaddr_dl *dl = (const struct sockaddr_dl *)(const void *)a->ifa_addr;
      if (dl->sdl_alen == 6) {
        const unsigned char *m = (const unsigned char *)LLADDR(dl);
        snprintf(mac, sizeof mac, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
      }
    }
#else
    if (a->ifa_addr->sa_family == AF_PACKET) {
      const struct sockaddr_ll *ll = (const struct sockaddr_ll *)(const void *)a->ifa_addr;
      if (ll->sll_halen == 6) {
        const unsigned char *m = ll->sll_addr;
        snprintf(mac, sizeof mac, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
      }
    }
#endif
  }
  int mtu = iface_mtu(name);
  jb_obj_open(b);
  jb_key(b, "name"); jb_str(b, name);
  jb_key(b, "up"); jb_bool(b, (flags & IFF_UP) != 0);
  jb_key(b, "running"); jb_bool(b, (flags & IFF_RUNNING) != 0);
  jb_key(b, "loopback"); jb_bool(b, (flags & IFF_LOOPBACK) != 0);
  jb_key(b, "mtu"); if (mtu > 0) jb_int(b, mtu); else jb_null(b);
  jb_key(b, "mac"); jb_str(b, mac[0] && strcmp(mac, "00:00:00:00:00:00") ? mac : NULL);
  for (int fam = 0; fam < 2; fam++) {
    jb_key(b, fam == 0 ? "ipv4" : "ipv6");
    jb_arr_open(b);
    for (struct ifaddrs *a = all; a; a = a->ifa_next) {
      if (strcmp(a->ifa_name, name) != 0 || !a->ifa_addr) continue;
      char text[INET6_ADDRSTRLEN] = "";
      if (fam == 0 && a->ifa_addr->sa_family == AF_INET) {
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)a->ifa_addr)->sin_addr, text, sizeof text);
      } else if (fam == 1 && a->ifa_addr->sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)a->ifa_addr)->sin6_addr, text, sizeof text);
      }
      if (text[0]) jb_str(b, text);
    }
    jb_arr_close(b);
  }
  /* the same IPv4 addresses with their prefix length: which subnet each link is in */
  jb_key(b, "ipv4_cidr");
  jb_arr_open(b);
  for (struct ifaddrs *a = all; a; a = a->ifa_next) {
    if (strcmp(a->ifa_name, name) != 0 || !a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = "";
    inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)a->ifa_addr)->sin_addr, text, sizeof text);
    int prefix = 32;
    if (a->ifa_netmask && a->ifa_netmask->sa_family == AF_INET) {
      uint32_t m = ntohl(((const struct sockaddr_in *)(const void *)a->ifa_netmask)->sin_addr.s_addr);
      prefix = 0;
      while (prefix < 32 && (m & (0x80000000u >> prefix))) prefix++;
    }
    if (text[0]) jb_strf(b, "%s/%d", text, prefix);
  }
  jb_arr_close(b);
  jb_obj_close(b);
}

bool net_probe_interfaces(jbuf *b, probe_err *e) {
  struct ifaddrs *all = NULL;
  if (getifaddrs(&all) != 0) {
    snprintf(e->message, sizeof e->message, "getifaddrs failed");
    return false;
  }
  const char *seen[MAX_IFACES];
  size_t nseen = 0;
  jb_arr_open(b);
  for (struct ifaddrs *a = all; a && nseen < MAX_IFACES; a = a->ifa_next) {
    bool dup = false;
    for (size_t i = 0; i < nseen && !dup; i++) dup = strcmp(seen[i], a->ifa_name) == 0;
    if (dup) continue;
    seen[nseen++] = a->ifa_name;
    write_iface(b, all, a->ifa_name);
  }
  jb_arr_close(b);
  freeifaddrs(all);
  return true;
}

bool net_iface_ipv4(const char *ifname, char *out, size_t cap) {
  struct ifaddrs *all = NULL;
  if (!ifname || getifaddrs(&all) != 0) return false;
  bool found = false;
  for (struct ifaddrs *a = all; a && !found; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || strcmp(a->ifa_name, ifname) != 0) continue;
    found = inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)a->ifa_addr)->sin_addr, out, (socklen_t)cap) != NULL;
  }
  freeifaddrs(all);
  return found;
}
