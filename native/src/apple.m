/* The only Objective-C file: Metal GPU facts, IOKit GPU core count and the thermal state.
 * Compiled only on macOS with -fobjc-arc; other platforms use gpu_none.c and sys_linux.c. */
#import <CoreFoundation/CoreFoundation.h>
#import <Foundation/Foundation.h>
#import <IOKit/IOKitLib.h>
#import <Metal/Metal.h>
#include <stdio.h>

#include "internal.h"

/* Reads "gpu-core-count" from the AGXAccelerator IOService; -1 when absent. */
static int64_t gpu_core_count(void) {
  int64_t cores = -1;
  io_iterator_t it = IO_OBJECT_NULL;
  if (IOServiceGetMatchingServices(kIOMainPortDefault, IOServiceMatching("AGXAccelerator"), &it) != KERN_SUCCESS) {
    return -1;
  }
  io_object_t svc;
  while (cores < 0 && (svc = IOIteratorNext(it)) != IO_OBJECT_NULL) {
    CFTypeRef v = IORegistryEntryCreateCFProperty(svc, CFSTR("gpu-core-count"), kCFAllocatorDefault, 0);
    if (v) {
      if (CFGetTypeID(v) == CFNumberGetTypeID()) {
        long long n = 0;
        if (CFNumberGetValue((CFNumberRef)v, kCFNumberLongLongType, &n)) cores = n;
      }
      CFRelease(v);
    }
    IOObjectRelease(svc);
  }
  IOObjectRelease(it);
  return cores;
}

bool gpu_probe(jbuf *b, probe_err *e) {
  @autoreleasepool {
    id<MTLDevice> dev = MTLCreateSystemDefaultDevice();
    if (!dev) {
      snprintf(e->message, sizeof e->message, "MTLCreateSystemDefaultDevice returned nil");
      return false;
    }
    int64_t cores = gpu_core_count();
    jb_obj_open(b);
    jb_key(b, "api"); jb_str(b, "metal");
    jb_key(b, "name"); jb_str(b, dev.name.UTF8String);
    jb_key(b, "unified_memory"); jb_bool(b, dev.hasUnifiedMemory);
    jb_key(b, "recommended_max_working_set_bytes"); jb_uint(b, dev.recommendedMaxWorkingSetSize);
    jb_key(b, "current_allocated_bytes"); jb_uint(b, (uint64_t)dev.currentAllocatedSize);
    jb_key(b, "core_count"); if (cores > 0) jb_int(b, cores); else jb_null(b);
    jb_obj_close(b);
    return true;
  }
}

bool sys_probe_thermal(jbuf *b, probe_err *e) {
  (void)e;
  @autoreleasepool {
    NSProcessInfoThermalState s = [NSProcessInfo processInfo].thermalState;
    const char *name = s == NSProcessInfoThermalStateNominal    ? "nominal"
                       : s == NSProcessInfoThermalStateFair     ? "fair"
                       : s == NSProcessInfoThermalStateSerious  ? "serious"
                       : s == NSProcessInfoThermalStateCritical ? "critical"
                                                                : "unknown";
    jb_obj_open(b);
    jb_key(b, "state"); jb_str(b, name);
    jb_key(b, "source"); jb_str(b, "NSProcessInfo.thermalState");
    jb_key(b, "max_zone_celsius"); jb_null(b);
    jb_obj_close(b);
    return true;
  }
}
