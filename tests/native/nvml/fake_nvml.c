// SPDX-License-Identifier: Apache-2.0
/*
 * A fake libnvidia-ml.so.1 for tests: simulated H200 GPUs behind the real NVML ABI (the struct layouts
 * pynvml uses). Values and knobs are documented in README.md next to this file; keep the two in step.
 *
 * State comes from FAKE_NVML_* environment variables and, when FAKE_NVML_SCENARIO names a file, from that
 * file's NAME=VALUE lines, re-read whenever its mtime or size changes. Calls are thread-safe; a call's
 * artificial delay is slept outside the lock so GPUs never wait on each other.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* --- NVML ABI subset (layouts as in nvml.h and pynvml) ---------------------------------------------------- */
typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_TIMEOUT = 10, NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_MEMORY = 20, NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 16
#define MAX_PROCS 64
#define MAX_XIDS 64
#define MAX_RULES 64
#define MAX_EVENT_SETS 64
#define FI_PCIE_TX_BYTES 197
#define FI_PCIE_RX_BYTES 198
#define FI_NVLINK_LINK_COUNT 91          /* NVML_FI_DEV_NVLINK_LINK_COUNT */
#define FI_NVLINK_THROUGHPUT_DATA_TX 138 /* NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: KiB, scopeId = link */
#define FI_NVLINK_THROUGHPUT_DATA_RX 139
#define NVLINK_ERROR_COUNTERS 4          /* nvmlNvLinkErrorCounter_t: DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT, DL_CRC_DATA */
#define EVENT_XID 0x8ULL
#define EVENT_SUPPORTED (0x1ULL | 0x2ULL | 0x8ULL)

typedef struct fake_gpu { int index; } *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

typedef union { double dVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal;
                long long sllVal; int siVal; unsigned short usVal; } nvmlValue_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; }
    nvmlProcessInfo_t;
typedef struct { unsigned int pid; unsigned long long timeStamp; unsigned int smUtil, memUtil, encUtil, decUtil; }
    nvmlProcessUtilizationSample_t;

typedef struct event_set *nvmlEventSet_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

typedef struct gpm_sample { int taken; int gpu; double t_s; } *nvmlGpmSample_t;
typedef struct { const char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct { unsigned int metricId; nvmlReturn_t nvmlReturn; double value; nvmlGpmMetricInfo_t metricInfo; }
    nvmlGpmMetric_t;
typedef struct {
    unsigned int version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[];
} nvmlGpmMetricsGet_t;
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;

/* --- scenario -------------------------------------------------------------------------------------------------- */
struct proc { int pid_is_self; unsigned int pid; int gpu; unsigned long long mem_bytes; unsigned int sm_pct; int graphics; };
struct xid { int gpu; unsigned long long code; double after_s; };
struct rule { int gpu; char name[64]; };  /* gpu -1: every GPU */

struct scenario {
    int gpus;
    int init_error;
    struct proc procs[MAX_PROCS]; int nprocs;
    double lost_after_s[MAX_GPUS];  /* < 0: never */
    struct xid xids[MAX_XIDS]; int nxids;
    struct rule unsupported[MAX_RULES]; int nunsupported;
    long delay_us;
    long gpu_delay_us[MAX_GPUS];
    long pcie_throughput_us;
    int nvlinks; /* active NVLinks per GPU; 0: NVLink not supported */
};

struct event_set {
    int used;
    unsigned long long registered[MAX_GPUS];
    unsigned char delivered[MAX_XIDS];
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct scenario g_sc;
static int g_loaded;
static char g_file[1024];
static struct timespec g_file_mtime;
static off_t g_file_size = -1;
static ino_t g_file_ino;
static int g_init_count;
static double g_t0_s = -1;
static struct fake_gpu g_gpus[MAX_GPUS];
static struct event_set g_sets[MAX_EVENT_SETS];

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static unsigned long long realtime_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

static double elapsed_s(void) { return g_t0_s < 0 ? 0.0 : mono_s() - g_t0_s; }

static void sleep_us(long us) {
    if (us <= 0) return;
    struct timespec ts = { us / 1000000L, (us % 1000000L) * 1000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static void scenario_defaults(struct scenario *sc) {
    memset(sc, 0, sizeof(*sc));
    sc->gpus = 2;
    for (int i = 0; i < MAX_GPUS; i++) sc->lost_after_s[i] = -1;
    sc->pcie_throughput_us = 20000;
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r')) *--end = '\0';
    return s;
}

/* Splits a ","-separated list in place, calling item() on each non-empty entry. */
static void each_item(char *list, void (*item)(struct scenario *, char *), struct scenario *sc) {
    char *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        tok = trim(tok);
        if (*tok) item(sc, tok);
    }
}

static void parse_proc(struct scenario *sc, char *tok) {  /* PID@GPU:MEM:SM[:graphics] */
    if (sc->nprocs >= MAX_PROCS) return;
    struct proc p = {0};
    char pid[32] = "", kind[16] = "";
    if (sscanf(tok, "%31[^@]@%d:%llu:%u:%15s", pid, &p.gpu, &p.mem_bytes, &p.sm_pct, kind) < 4) return;
    if (strcmp(pid, "self") == 0) p.pid_is_self = 1;
    else p.pid = (unsigned int)strtoul(pid, NULL, 10);
    p.graphics = strcmp(kind, "graphics") == 0;
    sc->procs[sc->nprocs++] = p;
}

static void parse_lost(struct scenario *sc, char *tok) {  /* GPU[@SECONDS] */
    int gpu = -1;
    double after = 0;
    if (sscanf(tok, "%d@%lf", &gpu, &after) >= 1 && gpu >= 0 && gpu < MAX_GPUS) sc->lost_after_s[gpu] = after;
}

static void parse_xid(struct scenario *sc, char *tok) {  /* GPU:CODE[@SECONDS] */
    if (sc->nxids >= MAX_XIDS) return;
    struct xid x = {0};
    if (sscanf(tok, "%d:%llu@%lf", &x.gpu, &x.code, &x.after_s) >= 2) sc->xids[sc->nxids++] = x;
}

static void parse_unsupported(struct scenario *sc, char *tok) {  /* GPU:FUNCTION, GPU may be '*' */
    if (sc->nunsupported >= MAX_RULES) return;
    char *colon = strchr(tok, ':');
    if (!colon) return;
    *colon = '\0';
    struct rule r;
    r.gpu = strcmp(trim(tok), "*") == 0 ? -1 : atoi(tok);
    snprintf(r.name, sizeof(r.name), "%s", trim(colon + 1));
    sc->unsupported[sc->nunsupported++] = r;
}

static void parse_gpu_delay(struct scenario *sc, char *tok) {  /* GPU:US */
    int gpu;
    long us;
    if (sscanf(tok, "%d:%ld", &gpu, &us) == 2 && gpu >= 0 && gpu < MAX_GPUS) sc->gpu_delay_us[gpu] = us;
}

static void apply(struct scenario *sc, const char *name, const char *value) {
    if (strncmp(name, "FAKE_NVML_", 10) == 0) name += 10;
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", value);
    if (strcmp(name, "GPUS") == 0) {
        int n = atoi(buf);
        sc->gpus = n < 0 ? 0 : n > MAX_GPUS ? MAX_GPUS : n;
    } else if (strcmp(name, "INIT_ERROR") == 0) {
        sc->init_error = atoi(buf);
    } else if (strcmp(name, "PROCESSES") == 0) {
        sc->nprocs = 0;
        each_item(buf, parse_proc, sc);
    } else if (strcmp(name, "LOST") == 0) {
        for (int i = 0; i < MAX_GPUS; i++) sc->lost_after_s[i] = -1;
        each_item(buf, parse_lost, sc);
    } else if (strcmp(name, "XID") == 0) {
        sc->nxids = 0;
        each_item(buf, parse_xid, sc);
    } else if (strcmp(name, "UNSUPPORTED") == 0) {
        sc->nunsupported = 0;
        each_item(buf, parse_unsupported, sc);
    } else if (strcmp(name, "DELAY_US") == 0) {
        sc->delay_us = atol(buf);
    } else if (strcmp(name, "GPU_DELAY_US") == 0) {
        memset(sc->gpu_delay_us, 0, sizeof(sc->gpu_delay_us));
        each_item(buf, parse_gpu_delay, sc);
    } else if (strcmp(name, "PCIE_THROUGHPUT_US") == 0) {
        sc->pcie_throughput_us = atol(buf);
    } else if (strcmp(name, "NVLINKS") == 0) {
        int n = atoi(buf);
        sc->nvlinks = n < 0 ? 0 : n > 18 ? 18 : n;
    }
}

static const char *const KNOBS[] = { "GPUS", "INIT_ERROR", "PROCESSES", "LOST", "XID", "UNSUPPORTED", "DELAY_US",
                                     "GPU_DELAY_US", "PCIE_THROUGHPUT_US", "NVLINKS" };

static void load_env(struct scenario *sc) {
    for (size_t i = 0; i < sizeof(KNOBS) / sizeof(KNOBS[0]); i++) {
        char name[64];
        snprintf(name, sizeof(name), "FAKE_NVML_%s", KNOBS[i]);
        const char *value = getenv(name);
        if (value) apply(sc, KNOBS[i], value);
    }
}

static void load_file(struct scenario *sc, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[4096];
    while (fgets(line, sizeof(line), f)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *eq = strchr(line, '=');
        if (!eq) continue;
        *eq = '\0';
        apply(sc, trim(line), trim(eq + 1));
    }
    fclose(f);
}

/* Re-reads the environment and scenario file when the file changed. Caller holds g_lock. */
static void refresh(void) {
    if (!g_loaded) {
        const char *path = getenv("FAKE_NVML_SCENARIO");
        snprintf(g_file, sizeof(g_file), "%s", path ? path : "");
        for (int i = 0; i < MAX_GPUS; i++) g_gpus[i].index = i;
    }
    int changed = !g_loaded;
    struct stat st;
    if (g_file[0]) {
        if (stat(g_file, &st) == 0) {
            if (st.st_size != g_file_size || st.st_ino != g_file_ino || st.st_mtim.tv_sec != g_file_mtime.tv_sec
                || st.st_mtim.tv_nsec != g_file_mtime.tv_nsec) {
                changed = 1;
                g_file_size = st.st_size;
                g_file_ino = st.st_ino;
                g_file_mtime = st.st_mtim;
            }
        } else if (g_file_size != -1) {
            changed = 1;
            g_file_size = -1;
        }
    }
    if (!changed) return;
    struct scenario sc;
    scenario_defaults(&sc);
    load_env(&sc);
    if (g_file[0] && g_file_size != -1) load_file(&sc, g_file);
    g_sc = sc;
    g_loaded = 1;
}

static int gpu_index(nvmlDevice_t dev) {
    if (dev < &g_gpus[0] || dev >= &g_gpus[MAX_GPUS]) return -1;
    int i = (int)(dev - &g_gpus[0]);
    return i < g_sc.gpus ? i : -1;
}

static int is_unsupported(int gpu, const char *fn) {
    for (int i = 0; i < g_sc.nunsupported; i++) {
        const struct rule *r = &g_sc.unsupported[i];
        if ((r->gpu == -1 || r->gpu == gpu) && strcmp(r->name, fn) == 0) return 1;
    }
    return 0;
}

static int is_lost(int gpu) { return g_sc.lost_after_s[gpu] >= 0 && elapsed_s() >= g_sc.lost_after_s[gpu]; }

/* Common entry of every per-device call: validates, applies lost/unsupported/delay; returns the GPU index via *gpu. */
static nvmlReturn_t enter(nvmlDevice_t dev, const char *fn, int *gpu) {
    pthread_mutex_lock(&g_lock);
    refresh();
    nvmlReturn_t ret = NVML_SUCCESS;
    long delay = 0;
    int i = gpu_index(dev);
    if (g_init_count <= 0) ret = NVML_ERROR_UNINITIALIZED;
    else if (i < 0) ret = NVML_ERROR_INVALID_ARGUMENT;
    else {
        delay = g_sc.delay_us + g_sc.gpu_delay_us[i];
        if (is_lost(i)) ret = NVML_ERROR_GPU_IS_LOST;
        else if (is_unsupported(i, fn)) ret = NVML_ERROR_NOT_SUPPORTED;
    }
    pthread_mutex_unlock(&g_lock);
    sleep_us(delay);
    *gpu = i;
    return ret;
}

#define ENTER(dev, out) \
    int gpu; \
    nvmlReturn_t entered = enter((dev), __func__, &gpu); \
    if (entered != NVML_SUCCESS) return entered; \
    if ((out) == NULL) return NVML_ERROR_INVALID_ARGUMENT

/* --- simulated readings (README.md "Default scenario") ------------------------------------------------------- */
static const unsigned long long MEMORY_TOTAL_BYTES = 143771ULL * 1024 * 1024;
static unsigned long long memory_used_bytes(int i) { return 16ULL * 1024 * 1024 * 1024 * (unsigned long long)(i + 1); }
static unsigned int power_mw(int i) { return 300000u + 100000u * (unsigned int)i; }
static unsigned int cap100(unsigned int v) { return v > 100 ? 100 : v; }
static unsigned long long pcie_tx_rate(int i) { return 1000000000ULL * (unsigned long long)(1 + i); }
static unsigned long long pcie_rx_rate(int i) { return 1000000000ULL * (unsigned long long)(2 + i); }
/* NVLink l of GPU i: data KiB/s sent (received: twice that) and error counts (README.md "NVLink") */
static unsigned long long nvlink_tx_kib_rate(int i, unsigned int l) { return 1000ULL * (unsigned long long)(1 + i) + 100ULL * l; }
static unsigned long long nvlink_errors(int i, unsigned int l, unsigned int counter) {
    switch (counter) {
    case 0: return (unsigned long long)(i + 1) * (l + 1); /* replay */
    case 1: return (unsigned long long)i;                /* recovery */
    case 2: return l;                                    /* CRC flit */
    default: return 0;                                   /* CRC data */
    }
}

/* --- library lifecycle ----------------------------------------------------------------------------------------- */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&g_lock);
    refresh();
    nvmlReturn_t ret = g_sc.init_error;
    if (ret == NVML_SUCCESS) {
        g_init_count++;
        if (g_t0_s < 0) g_t0_s = mono_s();
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = g_init_count > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (g_init_count > 0) g_init_count--;
    pthread_mutex_unlock(&g_lock);
    return ret;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *value) {
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return copy_string(version, length, "580.159.04");
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return copy_string(version, length, "13.580.159.04");
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    refresh();
    nvmlReturn_t ret = g_init_count > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    *count = (unsigned int)g_sc.gpus;
    pthread_mutex_unlock(&g_lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    refresh();
    nvmlReturn_t ret = g_init_count <= 0 ? NVML_ERROR_UNINITIALIZED
                     : index >= (unsigned int)g_sc.gpus ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
    if (ret == NVML_SUCCESS) *device = &g_gpus[index];
    pthread_mutex_unlock(&g_lock);
    return ret;
}

/* --- identity -------------------------------------------------------------------------------------------------- */
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index) {
    ENTER(dev, index);
    *index = (unsigned int)gpu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    ENTER(dev, name);
    return copy_string(name, length, "NVIDIA H200");
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    ENTER(dev, uuid);
    char buf[96];
    snprintf(buf, sizeof(buf), "GPU-00000000-fa4e-4c1d-9a6b-%012x", gpu);
    return copy_string(uuid, length, buf);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    ENTER(dev, pci);
    memset(pci, 0, sizeof(*pci));
    pci->domain = 0;
    pci->bus = 0x18u + 0x12u * (unsigned int)gpu;
    pci->device = 0;
    pci->pciDeviceId = 0x233310DEu;
    pci->pciSubSystemId = 0x18BE10DEu;
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", pci->bus);
    snprintf(pci->busId, sizeof(pci->busId), "00000000:%02X:00.0", pci->bus);
    return NVML_SUCCESS;
}

/* --- readings -------------------------------------------------------------------------------------------------- */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *memory) {
    ENTER(dev, memory);
    memory->total = MEMORY_TOTAL_BYTES;
    memory->used = memory_used_bytes(gpu);
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *memory) {
    ENTER(dev, memory);
    if (memory->version != ((unsigned int)sizeof(nvmlMemory_v2_t) | (2u << 24))) return 25;  /* version mismatch */
    memory->total = MEMORY_TOTAL_BYTES;
    memory->reserved = 512ULL * 1024 * 1024;
    memory->used = memory_used_bytes(gpu);
    memory->free = memory->total - memory->used - memory->reserved;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *util) {
    ENTER(dev, util);
    util->gpu = cap100(40u + 30u * (unsigned int)gpu);
    util->memory = cap100(10u + 5u * (unsigned int)gpu);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t dev, unsigned int *util, unsigned int *period_us) {
    ENTER(dev, util);
    *util = cap100(2u + (unsigned int)gpu);
    if (period_us) *period_us = 167000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t dev, unsigned int *util, unsigned int *period_us) {
    ENTER(dev, util);
    *util = cap100(4u + (unsigned int)gpu);
    if (period_us) *period_us = 167000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *power_mw_out) {
    ENTER(dev, power_mw_out);
    *power_mw_out = power_mw(gpu);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t dev, unsigned int *limit_mw) {
    ENTER(dev, limit_mw);
    *limit_mw = 700000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t dev, unsigned long long *energy_mj) {
    ENTER(dev, energy_mj);
    pthread_mutex_lock(&g_lock);
    double seconds = elapsed_s();
    pthread_mutex_unlock(&g_lock);
    *energy_mj = 1000000000ULL * (unsigned long long)(gpu + 1) + (unsigned long long)(power_mw(gpu) * seconds);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned int *temp_c) {
    ENTER(dev, temp_c);
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *temp_c = 50u + 10u * (unsigned int)gpu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t dev, int threshold, unsigned int *temp_c) {
    ENTER(dev, temp_c);
    switch (threshold) {
    case 0: *temp_c = 94; return NVML_SUCCESS;  /* shutdown */
    case 1: *temp_c = 89; return NVML_SUCCESS;  /* slowdown */
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, int type, unsigned int *mhz) {
    ENTER(dev, mhz);
    switch (type) {
    case 0: case 1: *mhz = 1980u - 225u * (unsigned int)gpu; return NVML_SUCCESS;  /* graphics, SM */
    case 2: *mhz = 3201; return NVML_SUCCESS;  /* memory */
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t dev, int type, unsigned int *mhz) {
    ENTER(dev, mhz);
    switch (type) {
    case 0: case 1: *mhz = 1980; return NVML_SUCCESS;
    case 2: *mhz = 3201; return NVML_SUCCESS;
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t dev, unsigned long long *reasons) {
    ENTER(dev, reasons);
    *reasons = (gpu % 2) ? 0x4ULL : 0x0ULL;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t dev, int *pstate) {
    ENTER(dev, pstate);
    *pstate = (gpu % 2) ? 2 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, int error_type, int counter_type, unsigned long long *count) {
    ENTER(dev, count);
    (void)counter_type;
    *count = error_type == 0 ? 5ULL * (unsigned long long)gpu : (unsigned long long)gpu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t dev, unsigned int *value) {
    ENTER(dev, value);
    *value = 2u * (unsigned int)gpu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t dev, int counter, unsigned int *kb_per_s) {
    ENTER(dev, kb_per_s);
    pthread_mutex_lock(&g_lock);
    long block_us = g_sc.pcie_throughput_us;
    pthread_mutex_unlock(&g_lock);
    sleep_us(block_us);
    if (counter == 0) *kb_per_s = (unsigned int)(pcie_tx_rate(gpu) / 1024);
    else if (counter == 1) *kb_per_s = (unsigned int)(pcie_rx_rate(gpu) / 1024);
    else return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count, nvmlFieldValue_t *values) {
    ENTER(dev, values);
    pthread_mutex_lock(&g_lock);
    double seconds = elapsed_s();
    for (int k = 0; k < count; k++) {
        nvmlFieldValue_t *v = &values[k];
        char pseudo[32];
        snprintf(pseudo, sizeof(pseudo), "field%u", v->fieldId);
        v->timestamp = (long long)realtime_us();
        v->latencyUsec = 0;
        v->valueType = 3;  /* unsigned long long */
        v->value.ullVal = 0;
        int nvlink = v->fieldId == FI_NVLINK_THROUGHPUT_DATA_TX || v->fieldId == FI_NVLINK_THROUGHPUT_DATA_RX;
        if ((v->fieldId == FI_NVLINK_LINK_COUNT || nvlink) && g_sc.nvlinks > 0 && !is_unsupported(gpu, pseudo)) {
            if (nvlink && v->scopeId >= (unsigned int)g_sc.nvlinks) {
                v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
                continue;
            }
            unsigned long long tx = nvlink ? nvlink_tx_kib_rate(gpu, v->scopeId) : 0;
            v->value.ullVal = !nvlink ? (unsigned long long)g_sc.nvlinks
                              : (unsigned long long)((v->fieldId == FI_NVLINK_THROUGHPUT_DATA_TX ? tx : 2 * tx) * seconds);
            v->nvmlReturn = NVML_SUCCESS;
            continue;
        }
        if ((v->fieldId != FI_PCIE_TX_BYTES && v->fieldId != FI_PCIE_RX_BYTES) || is_unsupported(gpu, pseudo)) {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        unsigned long long rate = v->fieldId == FI_PCIE_TX_BYTES ? pcie_tx_rate(gpu) : pcie_rx_rate(gpu);
        v->value.ullVal = (unsigned long long)(rate * seconds);
        v->nvmlReturn = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, unsigned int *is_active) {
    ENTER(dev, is_active);
    if (g_sc.nvlinks == 0 || is_unsupported(gpu, "nvmlDeviceGetNvLinkState")) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned int)g_sc.nvlinks) return NVML_ERROR_INVALID_ARGUMENT;
    *is_active = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t dev, unsigned int link, unsigned int counter,
                                             unsigned long long *value) {
    ENTER(dev, value);
    if (g_sc.nvlinks == 0 || is_unsupported(gpu, "nvmlDeviceGetNvLinkErrorCounter")) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned int)g_sc.nvlinks || counter >= NVLINK_ERROR_COUNTERS) return NVML_ERROR_INVALID_ARGUMENT;
    *value = nvlink_errors(gpu, link, counter);
    return NVML_SUCCESS;
}

/* --- processes ------------------------------------------------------------------------------------------------- */
static unsigned int proc_pid(const struct proc *p) { return p->pid_is_self ? (unsigned int)getpid() : p->pid; }

static int proc_alive(unsigned int pid) { return kill((pid_t)pid, 0) == 0 || errno != ESRCH; }

/* The live processes of the given kind on gpu, copied out under the lock. */
static int live_procs(int gpu, int graphics, int busy_only, struct proc *out) {
    int n = 0;
    pthread_mutex_lock(&g_lock);
    for (int k = 0; k < g_sc.nprocs; k++) {
        const struct proc *p = &g_sc.procs[k];
        if (p->gpu != gpu || (graphics >= 0 && p->graphics != graphics) || (busy_only && p->sm_pct == 0)) continue;
        out[n] = *p;
        out[n].pid = proc_pid(p);
        n++;
    }
    pthread_mutex_unlock(&g_lock);
    int alive = 0;
    for (int k = 0; k < n; k++)
        if (proc_alive(out[k].pid)) out[alive++] = out[k];
    return alive;
}

static nvmlReturn_t running_processes(nvmlDevice_t dev, const char *fn, int graphics, unsigned int *count,
                                      nvmlProcessInfo_t *infos) {
    int gpu;
    nvmlReturn_t entered = enter(dev, fn, &gpu);
    if (entered != NVML_SUCCESS) return entered;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    struct proc procs[MAX_PROCS];
    int n = live_procs(gpu, graphics, 0, procs);
    if (infos == NULL || *count < (unsigned int)n) {
        *count = (unsigned int)n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int k = 0; k < n; k++) {
        infos[k].pid = procs[k].pid;
        infos[k].usedGpuMemory = procs[k].mem_bytes;
        infos[k].gpuInstanceId = 0xFFFFFFFFu;
        infos[k].computeInstanceId = 0xFFFFFFFFu;
    }
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count, nvmlProcessInfo_t *infos) {
    return running_processes(dev, __func__, 0, count, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count, nvmlProcessInfo_t *infos) {
    return running_processes(dev, __func__, 1, count, infos);
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t dev, nvmlProcessUtilizationSample_t *samples,
                                             unsigned int *count, unsigned long long last_seen_us) {
    int gpu;
    nvmlReturn_t entered = enter(dev, __func__, &gpu);
    if (entered != NVML_SUCCESS) return entered;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    struct proc procs[MAX_PROCS];
    int n = live_procs(gpu, -1, 1, procs);
    unsigned long long now_us = realtime_us();
    if (n == 0 || now_us <= last_seen_us) return NVML_ERROR_NOT_FOUND;
    if (samples == NULL || *count < (unsigned int)n) {
        *count = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int k = 0; k < n; k++) {
        samples[k].pid = procs[k].pid;
        samples[k].timeStamp = now_us;
        samples[k].smUtil = cap100(procs[k].sm_pct);
        samples[k].memUtil = cap100(procs[k].sm_pct / 4);
        samples[k].encUtil = 0;
        samples[k].decUtil = 0;
    }
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}

/* --- events ---------------------------------------------------------------------------------------------------- */
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dev, unsigned long long *types) {
    ENTER(dev, types);
    *types = EVENT_SUPPORTED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (set == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = NVML_ERROR_MEMORY;
    for (int k = 0; k < MAX_EVENT_SETS; k++) {
        if (!g_sets[k].used) {
            memset(&g_sets[k], 0, sizeof(g_sets[k]));
            g_sets[k].used = 1;
            *set = &g_sets[k];
            ret = NVML_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

static int valid_set(nvmlEventSet_t set) { return set >= &g_sets[0] && set < &g_sets[MAX_EVENT_SETS] && set->used; }

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types, nvmlEventSet_t set) {
    int gpu;
    nvmlReturn_t entered = enter(dev, __func__, &gpu);
    if (entered != NVML_SUCCESS) return entered;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (!valid_set(set)) ret = NVML_ERROR_INVALID_ARGUMENT;
    else if (types & ~EVENT_SUPPORTED) ret = NVML_ERROR_NOT_SUPPORTED;
    else set->registered[gpu] |= types;
    pthread_mutex_unlock(&g_lock);
    return ret;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    if (data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    double deadline = mono_s() + timeout_ms / 1000.0;
    for (;;) {
        pthread_mutex_lock(&g_lock);
        refresh();
        if (!valid_set(set)) {
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        double seconds = elapsed_s();
        for (int k = 0; k < g_sc.nxids; k++) {
            const struct xid *x = &g_sc.xids[k];
            if (set->delivered[k] || x->gpu < 0 || x->gpu >= g_sc.gpus || seconds < x->after_s
                || !(set->registered[x->gpu] & EVENT_XID))
                continue;
            set->delivered[k] = 1;
            memset(data, 0, sizeof(*data));
            data->device = &g_gpus[x->gpu];
            data->eventType = EVENT_XID;
            data->eventData = x->code;
            data->gpuInstanceId = 0xFFFFFFFFu;
            data->computeInstanceId = 0xFFFFFFFFu;
            pthread_mutex_unlock(&g_lock);
            return NVML_SUCCESS;
        }
        pthread_mutex_unlock(&g_lock);
        double left = deadline - mono_s();
        if (left <= 0) return NVML_ERROR_TIMEOUT;
        sleep_us(left > 0.01 ? 10000 : (long)(left * 1e6) + 1);
    }
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t ret = valid_set(set) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) set->used = 0;
    pthread_mutex_unlock(&g_lock);
    return ret;
}

/* --- GPM ------------------------------------------------------------------------------------------------------- */
nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t dev, nvmlGpmSupport_t *support) {
    ENTER(dev, support);
    if (support->version != 1) return NVML_ERROR_INVALID_ARGUMENT;
    support->isSupportedDevice = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    if (sample == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *sample = calloc(1, sizeof(**sample));
    return *sample ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    if (sample == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    free(sample);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t dev, nvmlGpmSample_t sample) {
    ENTER(dev, sample);
    sample->taken = 1;
    sample->gpu = gpu;
    sample->t_s = mono_s();
    return NVML_SUCCESS;
}

static const nvmlGpmMetricInfo_t GPM_INFO[] = {
    [2] = { "sm_util", "SM utilization", "%" },
    [3] = { "sm_occupancy", "SM occupancy", "%" },
    [5] = { "any_tensor_util", "Any tensor utilization", "%" },
    [10] = { "dram_bw_util", "DRAM bandwidth utilization", "%" },
};

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *mg) {
    if (mg == NULL || mg->version != 1 || mg->sample1 == NULL || mg->sample2 == NULL || !mg->sample1->taken
        || !mg->sample2->taken || mg->sample1->gpu != mg->sample2->gpu)
        return NVML_ERROR_INVALID_ARGUMENT;
    int gpu = mg->sample1->gpu;
    for (unsigned int k = 0; k < mg->numMetrics; k++) {
        nvmlGpmMetric_t *m = &mg->metrics[k];
        m->nvmlReturn = NVML_SUCCESS;
        switch (m->metricId) {
        case 2: m->value = cap100(60u + 10u * (unsigned int)gpu); break;
        case 3: m->value = cap100(25u + 5u * (unsigned int)gpu); break;
        case 5: m->value = cap100(30u + 20u * (unsigned int)gpu); break;
        case 10: m->value = cap100(15u + 10u * (unsigned int)gpu); break;
        default: m->value = 0; m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; continue;
        }
        m->metricInfo = GPM_INFO[m->metricId];
    }
    return NVML_SUCCESS;
}
