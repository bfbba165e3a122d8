/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stepping aside for the program's own CUPTI users: torch.profiler (Kineto), CUPTI-based libraries. CUPTI takes one
 * subscriber per process, and its activity API (kinds, buffer callbacks) is global, so a tool that starts while this
 * library holds CUPTI would get CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, or lose its records to our buffers.
 *
 * So the CUPTI imports of every other loaded object (their GOT slots for cuptiSubscribe, cuptiActivityEnable, ...)
 * are pointed at the wrappers below. A wrapper that means "a tool starts using CUPTI" (subscribe, enable an activity
 * kind, register activity buffers) first makes the library let go synchronously (window_step_aside: the open window
 * closed and recorded, our kinds and callbacks off, our records flushed, unsubscribed), then calls CUPTI unchanged:
 * the other tool never sees an error and gets every record. The library takes CUPTI back once the other tool has
 * unsubscribed, disabled what it enabled (or finalized CUPTI) and made no CUPTI call for FOREIGN_QUIET_NS; the time
 * in between is stated in the window records (yielded_ns), and the re-weighting totals start again.
 *
 * Only calls through a GOT are seen, and functions looked up by name: on x86-64 the dlsym imports of other objects
 * are pointed at a wrapper too, which hands out the wrappers below for this CUPTI's functions looked up in a dlopen
 * handle (XLA and TensorFlow load CUPTI that way). Lookups in RTLD_DEFAULT or RTLD_NEXT depend on the calling object
 * (its scope, the object after it), so a trampoline passes them to dlsym with the caller's return address untouched,
 * unlooked-at. A tool that took CUPTI before this library was loaded (at cuInit) finds CUPTI held by itself; the
 * library waits until it is free (inject.c).
 * Objects loaded later are patched when the controller next looks (coexist_rescan, every 100 ms at most).
 */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "inject.h"

#if defined(__x86_64__)
#define JUMP_SLOT R_X86_64_JUMP_SLOT
#define GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define JUMP_SLOT R_AARCH64_JUMP_SLOT
#define GLOB_DAT R_AARCH64_GLOB_DAT
#else
#error "coexist.c: unknown architecture"
#endif

struct foreign_state g_foreign;

static void foreign_starts(void)
{
    atomic_store(&g_foreign.last_call_ns, monotonic_ns());
    if (!hold_aside())
        window_step_aside(); /* returns once the library holds nothing of CUPTI's */
}

static void foreign_call(void)
{
    atomic_store(&g_foreign.last_call_ns, monotonic_ns());
}

static CUptiResult CUPTIAPI w_subscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc fn, void *userdata)
{
    foreign_starts();
    CUptiResult rc = g_cupti.subscribe(subscriber, fn, userdata);
    if (rc == CUPTI_SUCCESS)
        atomic_store(&g_foreign.subscriber, (uintptr_t)*subscriber);
    return rc;
}

static CUptiResult CUPTIAPI w_subscribe_v2(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc fn, void *userdata,
                                           CUpti_SubscriberParams *params)
{
    foreign_starts();
    CUptiResult rc = g_cupti.subscribe_v2(subscriber, fn, userdata, params);
    if (rc == CUPTI_SUCCESS)
        atomic_store(&g_foreign.subscriber, (uintptr_t)*subscriber);
    return rc;
}

static CUptiResult CUPTIAPI w_unsubscribe(CUpti_SubscriberHandle subscriber)
{
    foreign_call();
    CUptiResult rc = g_cupti.unsubscribe(subscriber);
    uintptr_t expected = (uintptr_t)subscriber;
    atomic_compare_exchange_strong(&g_foreign.subscriber, &expected, 0);
    return rc;
}

static CUptiResult CUPTIAPI w_finalize(void)
{
    foreign_starts();
    CUptiResult rc = g_cupti.finalize();
    atomic_store(&g_foreign.subscriber, 0);
    atomic_store(&g_foreign.kinds, 0);
    return rc;
}

static CUptiResult CUPTIAPI w_activity_enable(CUpti_ActivityKind kind)
{
    foreign_starts();
    CUptiResult rc = g_cupti.activity_enable(kind);
    if (rc == CUPTI_SUCCESS && kind < 64)
        atomic_fetch_or(&g_foreign.kinds, 1ull << kind);
    return rc;
}

static CUptiResult CUPTIAPI w_activity_disable(CUpti_ActivityKind kind)
{
    foreign_call();
    CUptiResult rc = g_cupti.activity_disable(kind);
    if (kind < 64)
        atomic_fetch_and(&g_foreign.kinds, ~(1ull << kind));
    return rc;
}

static CUptiResult CUPTIAPI w_register_callbacks(CUpti_BuffersCallbackRequestFunc requested,
                                                 CUpti_BuffersCallbackCompleteFunc completed)
{
    foreign_starts();
    return g_cupti.activity_register_callbacks(requested, completed);
}

static CUptiResult CUPTIAPI w_flush_all(uint32_t flag)
{
    foreign_call();
    return g_cupti.activity_flush_all(flag);
}

struct hook {
    const char *name;
    void *wrapper;
    const void *target; /* the function the wrapper stands for */
};

static struct hook hooks[8];
static int hook_count;
static struct hook dlsym_hook; /* wrapper NULL: dlsym is left alone (not x86-64) */
static uintptr_t own_base, cupti_base;
static unsigned long long seen_adds;
static _Atomic uint64_t slots_patched, dlsym_slots_patched, lookups_diverted;

static void add_hook(const char *name, void *wrapper, const void *target)
{
    if (target != NULL) /* a CUPTI without the function: nobody can import it from this CUPTI */
        hooks[hook_count++] = (struct hook){name, wrapper, target};
}

static const struct hook *hook_named(const char *name)
{
    if (strncmp(name, "cupti", 5) != 0)
        return dlsym_hook.wrapper != NULL && strcmp(name, "dlsym") == 0 ? &dlsym_hook : NULL;
    for (int i = 0; i < hook_count; i++)
        if (strcmp(hooks[i].name, name) == 0)
            return &hooks[i];
    return NULL;
}

#if defined(__x86_64__)
/* dlsym as this library resolved it; read by the trampoline. */
__attribute__((visibility("hidden"))) void *otel_gpu_real_dlsym;
__attribute__((visibility("hidden"))) void otel_gpu_dlsym_trampoline(void);
__attribute__((visibility("hidden"), used)) void *otel_gpu_dlsym_in_handle(void *handle, const char *name);

/* dlsym(handle, name): RTLD_DEFAULT (0) and RTLD_NEXT (-1) go straight to dlsym, the return address untouched. */
__asm__(".text\n"
        ".p2align 4\n"
        ".type otel_gpu_dlsym_trampoline, @function\n"
        "otel_gpu_dlsym_trampoline:\n"
        "    endbr64\n"
        "    testq %rdi, %rdi\n"
        "    je 1f\n"
        "    cmpq $-1, %rdi\n"
        "    je 1f\n"
        "    jmp otel_gpu_dlsym_in_handle\n"
        "1:  jmpq *otel_gpu_real_dlsym(%rip)\n"
        ".size otel_gpu_dlsym_trampoline, .-otel_gpu_dlsym_trampoline\n");

/* A lookup in a dlopen handle: the caller's object does not change its result. */
void *otel_gpu_dlsym_in_handle(void *handle, const char *name)
{
    void *found = ((void *(*)(void *, const char *))otel_gpu_real_dlsym)(handle, name);
    if (found != NULL && name != NULL && strncmp(name, "cupti", 5) == 0) {
        const struct hook *hook = hook_named(name);
        if (hook != NULL && hook->target == found) {
            atomic_fetch_add(&lookups_diverted, 1);
            return hook->wrapper;
        }
    }
    return found;
}

static void hook_dlsym(void)
{
    otel_gpu_real_dlsym = (void *)dlsym;
    dlsym_hook = (struct hook){"dlsym", (void *)otel_gpu_dlsym_trampoline, (const void *)dlsym};
}
#else
static void hook_dlsym(void) {}
#endif

/* The loader relocates most dynamic-section addresses in place; the vDSO's and a few others' stay relative. */
static uintptr_t dyn_address(uintptr_t base, ElfW(Addr) value)
{
    return value < base ? base + value : value;
}

static void patch_slot(const struct dl_phdr_info *info, void **slot, void *wrapper)
{
    if (*slot == wrapper)
        return;
    uintptr_t at = (uintptr_t)slot;
    int relro = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_GNU_RELRO && at >= start && at < start + ph->p_memsz)
            relro = 1;
    }
    long page = sysconf(_SC_PAGESIZE);
    void *page_start = (void *)(at & ~(uintptr_t)(page - 1));
    if (relro && mprotect(page_start, (size_t)page, PROT_READ | PROT_WRITE) != 0)
        return;
    __atomic_store_n(slot, wrapper, __ATOMIC_RELEASE);
    if (relro)
        mprotect(page_start, (size_t)page, PROT_READ);
    atomic_fetch_add(wrapper == dlsym_hook.wrapper ? &dlsym_slots_patched : &slots_patched, 1);
}

static void patch_relocations(const struct dl_phdr_info *info, const ElfW(Rela) *rela, size_t bytes,
                              const ElfW(Sym) *symtab, const char *strtab)
{
    for (size_t i = 0; i < bytes / sizeof(*rela); i++) {
        uint32_t type = (uint32_t)ELF64_R_TYPE(rela[i].r_info);
        if (type != JUMP_SLOT && type != GLOB_DAT)
            continue;
        const struct hook *hook = hook_named(strtab + symtab[ELF64_R_SYM(rela[i].r_info)].st_name);
        if (hook != NULL)
            patch_slot(info, (void **)(info->dlpi_addr + rela[i].r_offset), hook->wrapper);
    }
}

static int patch_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    if (info->dlpi_addr == own_base || info->dlpi_addr == cupti_base || strstr(name, "linux-vdso") != NULL)
        return 0;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (dyn == NULL)
        return 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *jmprel = NULL, *rela = NULL;
    size_t jmprel_bytes = 0, rela_bytes = 0;
    int plt_is_rela = 1;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        switch (dyn->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_address(info->dlpi_addr, dyn->d_un.d_ptr); break;
        case DT_STRTAB: strtab = (const char *)dyn_address(info->dlpi_addr, dyn->d_un.d_ptr); break;
        case DT_JMPREL: jmprel = (const ElfW(Rela) *)dyn_address(info->dlpi_addr, dyn->d_un.d_ptr); break;
        case DT_PLTRELSZ: jmprel_bytes = dyn->d_un.d_val; break;
        case DT_PLTREL: plt_is_rela = dyn->d_un.d_val == DT_RELA; break;
        case DT_RELA: rela = (const ElfW(Rela) *)dyn_address(info->dlpi_addr, dyn->d_un.d_ptr); break;
        case DT_RELASZ: rela_bytes = dyn->d_un.d_val; break;
        default: break;
        }
    }
    if (symtab == NULL || strtab == NULL)
        return 0;
    if (jmprel != NULL && plt_is_rela)
        patch_relocations(info, jmprel, jmprel_bytes, symtab, strtab);
    if (rela != NULL)
        patch_relocations(info, rela, rela_bytes, symtab, strtab);
    return 0;
}

static int count_adds(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    *(unsigned long long *)data = info->dlpi_adds;
    return 1;
}

/* Called by the controller (and once at start): patches objects loaded since the last look. */
void coexist_rescan(void)
{
    unsigned long long adds = 0;
    dl_iterate_phdr(count_adds, &adds);
    if (adds == seen_adds)
        return;
    seen_adds = adds;
    dl_iterate_phdr(patch_object, NULL);
}

uint64_t coexist_slots_patched(void)
{
    return atomic_load(&slots_patched);
}

uint64_t coexist_dlsym_slots_patched(void)
{
    return atomic_load(&dlsym_slots_patched);
}

uint64_t coexist_lookups_diverted(void)
{
    return atomic_load(&lookups_diverted);
}

void coexist_init(void)
{
    /* dl_iterate_phdr's dlpi_addr is the load bias; dladdr's dli_fbase the lowest mapped address: equal for
     * shared objects, whose first segment starts at 0. */
    Dl_info self, cupti;
    if (dladdr((void *)coexist_init, &self) != 0)
        own_base = (uintptr_t)self.dli_fbase;
    if (dladdr(*(void **)&g_cupti.subscribe, &cupti) != 0)
        cupti_base = (uintptr_t)cupti.dli_fbase;
    add_hook("cuptiSubscribe", (void *)w_subscribe, *(void **)&g_cupti.subscribe);
    add_hook("cuptiSubscribe_v2", (void *)w_subscribe_v2, *(void **)&g_cupti.subscribe_v2);
    add_hook("cuptiUnsubscribe", (void *)w_unsubscribe, *(void **)&g_cupti.unsubscribe);
    add_hook("cuptiFinalize", (void *)w_finalize, *(void **)&g_cupti.finalize);
    add_hook("cuptiActivityEnable", (void *)w_activity_enable, *(void **)&g_cupti.activity_enable);
    add_hook("cuptiActivityDisable", (void *)w_activity_disable, *(void **)&g_cupti.activity_disable);
    add_hook("cuptiActivityRegisterCallbacks", (void *)w_register_callbacks,
             *(void **)&g_cupti.activity_register_callbacks);
    add_hook("cuptiActivityFlushAll", (void *)w_flush_all, *(void **)&g_cupti.activity_flush_all);
    hook_dlsym();
    coexist_rescan();
}

/* Whether the other tool is done: nothing of it subscribed or enabled, and quiet for FOREIGN_QUIET_NS. */
int coexist_foreign_done(uint64_t now)
{
    return atomic_load(&g_foreign.subscriber) == 0 && atomic_load(&g_foreign.kinds) == 0 &&
           now - atomic_load(&g_foreign.last_call_ns) >= FOREIGN_QUIET_NS;
}
