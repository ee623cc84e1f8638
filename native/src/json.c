/* Minimal streaming JSON writer with strict string escaping. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void jb_init(jbuf *b) { memset(b, 0, sizeof *b); }

void jb_free(jbuf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

char *jb_take(jbuf *b) {
  if (b->oom) {
    jb_free(b);
    return NULL;
  }
  jb_raw(b, "", 0); /* guarantees a buffer with a NUL */
  if (b->oom) {
    jb_free(b);
    return NULL;
  }
  char *out = b->data;
  memset(b, 0, sizeof *b);
  return out;
}

static bool jb_reserve(jbuf *b, size_t extra) {
  if (b->oom) return false;
  if (b->len + extra + 1 <= b->cap) return true;
  size_t cap = b->cap ? b->cap : 1024;
  while (cap < b->len + extra + 1) cap *= 2;
  char *p = realloc(b->data, cap);
  if (!p) {
    b->oom = true;
    return false;
  }
  b->data = p;
  b->cap = cap;
  return true;
}

void jb_raw(jbuf *b, const char *s, size_t n) {
  if (!jb_reserve(b, n)) return;
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
}

static void jb_sep(jbuf *b) {
  if (b->need_sep) jb_raw(b, ",", 1);
  b->need_sep = true;
}

void jb_obj_open(jbuf *b) {
  jb_sep(b);
  jb_raw(b, "{", 1);
  b->need_sep = false;
}

void jb_obj_close(jbuf *b) {
  jb_raw(b, "}", 1);
  b->need_sep = true;
}

void jb_arr_open(jbuf *b) {
  jb_sep(b);
  jb_raw(b, "[", 1);
  b->need_sep = false;
}

void jb_arr_close(jbuf *b) {
  jb_raw(b, "]", 1);
  b->need_sep = true;
}

size_t json_escape_into(const char *s, char *out, size_t cap) {
  static const char hex[] = "0123456789abcdef";
  size_t n = 0;
#define PUT(c)                       \
  do {                               \
    if (n + 1 < cap) out[n] = (c);   \
    n++;                             \
  } while (0)
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    unsigned char c = *p;
    switch (c) {
      case '"': PUT('\\'); PUT('"'); break;
      case '\\': PUT('\\'); PUT('\\'); break;
      case '\n': PUT('\\'); PUT('n'); break;
      case '\r': PUT('\\'); PUT('r'); break;
      case '\t': PUT('\\'); PUT('t'); break;
      case '\b': PUT('\\'); PUT('b'); break;
      case '\f': PUT('\\'); PUT('f'); break;
      default:
        if (c < 0x20 || c == 0x7f) {
          PUT('\\'); PUT('u'); PUT('0'); PUT('0');
          PUT(hex[c >> 4]); PUT(hex[c & 15]);
        } else if (c >= 0x80) {
          /* validate UTF-8; replace invalid bytes with U+FFFD */
          size_t len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
          bool ok = len != 0 && !(len == 2 && c < 0xc2) && !(len == 4 && c > 0xf4);
          for (size_t i = 1; ok && i < len; i++) ok = (p[i] & 0xc0) == 0x80;
          if (ok && len == 3) {
            unsigned cp = ((c & 0x0fu) << 12) | ((p[1] & 0x3fu) << 6) | (p[2] & 0x3fu);
            ok = cp >= 0x800 && !(cp >= 0xd800 && cp <= 0xdfff);
          }
          if (ok && len == 4) {
            unsigned cp = ((c & 0x07u) << 18) | ((p[1] & 0x3fu) << 12);
            ok = cp >= 0x10000 && cp <= 0x10ffff;
          }
          if (ok) {
            for (size_t i = 0; i < len; i++) PUT((char)p[i]);
            p += len - 1;
          } else {
            PUT('\\'); PUT('u'); PUT('f'); PUT('f'); PUT('f'); PUT('d');
          }
        } else {
          PUT((char)c);
        }
    }
  }
#undef PUT
  if (cap) out[n < cap ? n : cap - 1] = '\0';
  return n + 1;
}

static void jb_quoted(jbuf *b, const char *s) {
  size_t need = json_escape_into(s, NULL, 0);
  if (!jb_reserve(b, need + 2)) return;
  b->data[b->len++] = '"';
  json_escape_into(s, b->data + b->len, need);
  b->len += need - 1;
  b->data[b->len++] = '"';
  b->data[b->len] = '\0';
}

void jb_key(jbuf *b, const char *key) {
  jb_sep(b);
  jb_quoted(b, key);
  jb_raw(b, ":", 1);
  b->need_sep = false;
}

void jb_str(jbuf *b, const char *s) {
  if (!s) {
    jb_null(b);
    return;
  }
  jb_sep(b);
  jb_quoted(b, s);
}

void jb_strf(jbuf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  jb_str(b, tmp);
}

void jb_int(jbuf *b, int64_t v) {
  char tmp[32];
  int n = snprintf(tmp, sizeof tmp, "%lld", (long long)v);
  jb_sep(b);
  jb_raw(b, tmp, (size_t)n);
}

void jb_uint(jbuf *b, uint64_t v) {
  char tmp[32];
  int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
  jb_sep(b);
  jb_raw(b, tmp, (size_t)n);
}

void jb_num(jbuf *b, double v) {
  if (!isfinite(v)) {
    jb_null(b);
    return;
  }
  char tmp[48];
  int n = snprintf(tmp, sizeof tmp, "%.6g", v);
  jb_sep(b);
  jb_raw(b, tmp, (size_t)n);
}

void jb_bool(jbuf *b, bool v) {
  jb_sep(b);
  jb_raw(b, v ? "true" : "false", v ? 4 : 5);
}

void jb_null(jbuf *b) {
  jb_sep(b);
  jb_raw(b, "null", 4);
}

void jb_json(jbuf *b, const char *json) {
  jb_sep(b);
  jb_raw(b, json, strlen(json));
}
