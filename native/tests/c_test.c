/* C-level tests of liborchard internals and ABI argument checks. Built and run by
 * native/native_test.ts; prints one line per check and "PASS n" or "FAIL n/m". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/internal.h"
#include "../src/linktest_int.h"
#include "../src/sha256.h"

static int checks, failures;

#define CHECK(cond, name)                                              \
  do {                                                                 \
    checks++;                                                          \
    if (cond) {                                                        \
      printf("ok   %s\n", name);                                       \
    } else {                                                           \
      failures++;                                                      \
      printf("FAIL %s (%s:%d)\n", name, __FILE__, __LINE__);           \
    }                                                                  \
  } while (0)

static char *escaped(const char *in) {
  static char out[256];
  size_t need = 0;
  orch_json_escape(in, out, sizeof out, &need);
  return out;
}

static void test_json(void) {
  CHECK(strcmp(escaped("plain"), "plain") == 0, "escape keeps plain text");
  CHECK(strcmp(escaped("a\"b\\c"), "a\\\"b\\\\c") == 0, "escape quotes and backslashes");
  CHECK(strcmp(escaped("l1\nl2\tx\r"), "l1\\nl2\\tx\\r") == 0, "escape newline, tab, CR");
  CHECK(strcmp(escaped("\x01\x1f\x7f"), "\\u0001\\u001f\\u007f") == 0, "escape other control characters");
  CHECK(strcmp(escaped("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x8d\x8e"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x8d\x8e") == 0,
        "escape keeps valid UTF-8");
  CHECK(strcmp(escaped("bad\xff\xc3"), "bad\\ufffd\\ufffd") == 0, "escape replaces invalid UTF-8");
  CHECK(strcmp(escaped("\xed\xa0\x80"), "\\ufffd\\ufffd\\ufffd") == 0, "escape rejects UTF-16 surrogates");
  char small[4];
  size_t need = 0;
  CHECK(orch_json_escape("a\"bcdef", small, sizeof small, &need) == ORCH_ERR_BUFFER_TOO_SMALL && need == 9,
        "escape reports needed size when the buffer is small");
  CHECK(small[3] == '\0', "escape NUL-terminates a truncated buffer");
  CHECK(orch_json_escape("x", NULL, 0, &need) == ORCH_ERR_BUFFER_TOO_SMALL && need == 2, "escape sizes with cap 0");
  CHECK(orch_json_escape(NULL, small, 4, &need) == ORCH_ERR_INVALID_ARG, "escape rejects NULL input");
  CHECK(orch_json_escape("x", NULL, 4, &need) == ORCH_ERR_INVALID_ARG, "escape rejects NULL out with cap");
  CHECK(orch_json_escape("x", small, 4, NULL) == ORCH_ERR_INVALID_ARG, "escape rejects NULL needed");

  jbuf b;
  jb_init(&b);
  jb_obj_open(&b);
  jb_key(&b, "a"); jb_int(&b, -3);
  jb_key(&b, "b"); jb_arr_open(&b); jb_uint(&b, 1); jb_bool(&b, true); jb_null(&b); jb_str(&b, "x\"y"); jb_arr_close(&b);
  jb_key(&b, "c"); jb_num(&b, NAN);
  jb_key(&b, "d"); jb_obj_open(&b); jb_obj_close(&b);
  jb_key(&b, "e"); jb_str(&b, NULL);
  jb_key(&b, "k\n"); jb_num(&b, 1.5);
  jb_obj_close(&b);
  char *s = jb_take(&b);
  CHECK(s && strcmp(s, "{\"a\":-3,\"b\":[1,true,null,\"x\\\"y\"],\"c\":null,\"d\":{},\"e\":null,\"k\\n\":1.5}") == 0,
        "writer emits separators, nesting, null for NaN and escaped keys");
  free(s);
}

static void test_status(void) {
  for (int32_t c = 0; c >= ORCH_ERR_INTERNAL; c--) {
    char name[64];
    snprintf(name, sizeof name, "status %d has its own text", c);
    bool unique = strcmp(orch_status_str(c), "unknown status") != 0;
    for (int32_t d = 0; d >= ORCH_ERR_INTERNAL; d--) unique = unique && (d == c || strcmp(orch_status_str(c), orch_status_str(d)) != 0);
    CHECK(unique, name);
  }
  CHECK(strcmp(orch_status_str(-999), "unknown status") == 0, "unknown status code");
  CHECK(strcmp(orch_status_str(7), "unknown status") == 0, "positive status code is unknown");
  CHECK(orch_abi_version() == ORCH_ABI_VERSION, "abi version matches the header");
  CHECK(strcmp(orch_version(), ORCH_VERSION_STRING) == 0, "version string");
  orch_free(NULL);
  CHECK(1, "orch_free(NULL) is a no-op");
}

static void test_linktest_args(void) {
  orch_linktest *lt = NULL;
  CHECK(orch_linktest_create(NULL) == ORCH_ERR_INVALID_ARG, "create rejects NULL out");
  CHECK(orch_linktest_create(&lt) == ORCH_OK && lt, "create");
  CHECK(orch_linktest_set_option(lt, "nope", "1") == ORCH_ERR_INVALID_ARG, "unknown option");
  CHECK(orch_linktest_set_option(lt, "iterations", "0") == ORCH_ERR_INVALID_ARG, "iterations 0 rejected");
  CHECK(orch_linktest_set_option(lt, "iterations", "12x") == ORCH_ERR_INVALID_ARG, "non-numeric rejected");
  CHECK(orch_linktest_set_option(lt, "iterations", "-5") == ORCH_ERR_INVALID_ARG, "negative rejected");
  CHECK(orch_linktest_set_option(lt, "msg_bytes", "8") == ORCH_ERR_INVALID_ARG, "msg_bytes below header rejected");
  CHECK(orch_linktest_set_option(lt, "transport", "udp") == ORCH_ERR_INVALID_ARG, "unknown transport rejected");
  CHECK(orch_linktest_set_option(lt, "token", "") == ORCH_ERR_INVALID_ARG, "empty token rejected");
  CHECK(orch_linktest_set_option(lt, NULL, "1") == ORCH_ERR_INVALID_ARG, "NULL key rejected");
  CHECK(orch_linktest_set_option(lt, "iterations", "500") == ORCH_OK, "valid option accepted");
  CHECK(orch_linktest_set_option(lt, "transport", "tcp") == ORCH_OK, "transport tcp accepted");
  CHECK(orch_linktest_accept_run(lt) == ORCH_ERR_STATE, "accept_run before listen is a state error");
  CHECK(orch_linktest_connect_run(lt, "127.0.0.1", 9) == ORCH_ERR_STATE, "connect_run without token is a state error");
  CHECK(orch_linktest_connect_run(lt, NULL, 9) == ORCH_ERR_INVALID_ARG, "connect_run rejects NULL host");
  CHECK(orch_linktest_connect_run(lt, "127.0.0.1", 0) == ORCH_ERR_INVALID_ARG, "connect_run rejects port 0");
  size_t need = 1;
  CHECK(orch_linktest_result_json(lt, NULL, 0, &need) == ORCH_ERR_STATE && need == 0, "no result before a run");
  CHECK(orch_linktest_port(lt) == 0 && orch_linktest_port(NULL) == 0, "port is 0 before listen");
  CHECK(orch_linktest_listen(lt, "127.0.0.1", 0) == ORCH_OK && orch_linktest_port(lt) != 0, "listen on an ephemeral port");
  CHECK(orch_linktest_listen(lt, "127.0.0.1", 0) == ORCH_ERR_STATE, "second listen is a state error");
  /* cancelled before it starts: returns at once with a cancelled result */
  orch_linktest_set_option(lt, "token", "t");
  orch_linktest_cancel(lt);
  CHECK(orch_linktest_accept_run(lt) == ORCH_ERR_CANCELLED, "cancel before accept_run");
  CHECK(orch_linktest_result_json(lt, NULL, 0, &need) == ORCH_ERR_BUFFER_TOO_SMALL && need > 10, "result size query");
  char *buf = malloc(need);
  CHECK(buf && orch_linktest_result_json(lt, buf, need, &need) == ORCH_OK && strstr(buf, "\"status\":\"cancelled\""),
        "cancelled result JSON");
  CHECK(buf && strstr(buf, "\"schema\":\"orchard.linktest/1\"") && strstr(buf, "\"latency\":null"), "linktest schema shape");
  free(buf);
  orch_linktest_destroy(lt);
  orch_linktest_destroy(NULL);
  orch_linktest_cancel(NULL);
  CHECK(1, "destroy/cancel accept NULL");
}

static void test_rules(void) {
  uint8_t ll[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  uint8_t v4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2};
  uint8_t zero[16] = {0};
  char ip[16], text[64];
  CHECK(strcmp(gid_kind(ll, ip, sizeof ip), "link-local") == 0 && ip[0] == '\0', "fe80:: GID is link-local");
  CHECK(strcmp(gid_kind(v4, ip, sizeof ip), "ipv4-mapped") == 0 && strcmp(ip, "10.0.0.2") == 0, "IPv4-mapped GID");
  CHECK(strcmp(gid_kind(zero, ip, sizeof ip), "zero") == 0, "zero GID");
  gid_format(v4, text, sizeof text);
  CHECK(strcmp(text, "::ffff:10.0.0.2") == 0, "GID text");
  char reason[256];
  int gi;
  port_facts f = {.device = "rdma_en2", .apple = true, .state = 4, .link_layer = 2, .ipv4_gid_index = -1,
                  .any_gid_index = 0};
  CHECK(!port_usable(&f, &gi, reason, sizeof reason) &&
            strcmp(reason, "no IPv4-mapped GID: give en2 its own IPv4 address or remove it from the Thunderbolt bridge") == 0,
        "Apple port without IPv4-mapped GID is unusable with the reason");
  f.ipv4_gid_index = 2;
  CHECK(port_usable(&f, &gi, reason, sizeof reason) && gi == 2, "IPv4-mapped GID makes the port usable at its index");
  f.rdma_ctl = "disabled";
  CHECK(!port_usable(&f, &gi, reason, sizeof reason) && strstr(reason, "rdma_ctl enable"), "rdma_ctl disabled");
  f.rdma_ctl = NULL, f.state = 1;
  CHECK(!port_usable(&f, &gi, reason, sizeof reason) && strstr(reason, "not active"), "down port");
  port_facts ib = {.device = "mlx5_0", .state = 4, .link_layer = 1, .lid = 0, .ipv4_gid_index = -1, .any_gid_index = 0};
  CHECK(!port_usable(&ib, &gi, reason, sizeof reason) && strstr(reason, "subnet manager"), "IB port without LID");
  ib.lid = 7;
  CHECK(port_usable(&ib, &gi, reason, sizeof reason) && gi == 0, "IB port with LID uses GID 0");
}

static void test_crypto_and_messages(void) {
  uint8_t h[32];
  static const uint8_t abc[32] = {0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23,
                                  0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
  orch_sha256((const uint8_t *)"abc", 3, h);
  CHECK(memcmp(h, abc, 32) == 0, "SHA-256 of abc");
  static const uint8_t rfc4231_2[32] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24, 0x26, 0x08, 0x95, 0x75, 0xc7,
                                        0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27, 0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
  const char *msg = "what do ya want for nothing?";
  orch_hmac_sha256((const uint8_t *)"Jefe", 4, (const uint8_t *)msg, strlen(msg), h);
  CHECK(memcmp(h, rfc4231_2, 32) == 0, "HMAC-SHA-256 RFC 4231 case 2");
  CHECK(orch_ct_equal(h, rfc4231_2, 32) && !orch_ct_equal(h, abc, 32), "constant-time compare");
  uint8_t m[64];
  uint32_t seq = 0;
  lt_fill(m, sizeof m, 42);
  CHECK(lt_check(m, sizeof m, &seq) && seq == 42, "message round trip");
  m[40] ^= 1;
  CHECK(!lt_check(m, sizeof m, &seq), "corrupt payload detected");
  uint64_t rtt[5] = {5000, 1000, 3000, 2000, 4000};
  lt_stats s;
  memset(&s, 0, sizeof s);
  lt_rtt_stats(rtt, 5, &s);
  CHECK(s.rtt_min_us == 1 && s.rtt_p50_us == 3 && s.rtt_p99_us == 5 && s.rtt_max_us == 5 && s.rtt_mean_us == 3,
        "RTT percentiles");
}

static void test_run_cmd(void) {
  char out[64];
  int code = -1;
  const char *echo[] = {"/bin/echo", "hi", NULL};
  CHECK(orch_run_cmd(echo, 2000, out, sizeof out, &code) == ORCH_OK && strcmp(out, "hi\n") == 0 && code == 0,
        "run_cmd captures stdout");
  const char *sleep_[] = {"/bin/sleep", "5", NULL};
  uint64_t t0 = orch_now_ns();
  CHECK(orch_run_cmd(sleep_, 100, out, sizeof out, &code) == ORCH_ERR_TIMEOUT && orch_now_ns() - t0 < 2000000000ull,
        "run_cmd kills a child past its deadline");
}

static void test_probe_shape(void) {
  char *j = orch_probe_json(ORCH_PROBE_SKIP_RDMA, 2000);
  CHECK(j != NULL, "probe returns JSON");
  const char *keys[] = {"\"schema\":\"orchard.probe/1\"", "\"os\":", "\"machine\":", "\"cpu\":", "\"memory\":",
                        "\"gpu\":", "\"thermal\":", "\"rdma\":null", "\"interfaces\":", "\"errors\":["};
  for (size_t i = 0; j && i < sizeof keys / sizeof keys[0]; i++) {
    char name[96];
    snprintf(name, sizeof name, "probe has %s", keys[i]);
    CHECK(strstr(j, keys[i]) != NULL, name);
  }
  CHECK(j && strstr(j, "\"section\":\"rdma\",\"code\":\"skipped\""), "skipped section is recorded in errors");
  orch_free(j);
}

int main(void) {
  test_json();
  test_status();
  test_linktest_args();
  test_rules();
  test_crypto_and_messages();
  test_run_cmd();
  test_probe_shape();
  if (failures) {
    printf("FAIL %d/%d\n", failures, checks);
    return 1;
  }
  printf("PASS %d\n", checks);
  return 0;
}
