// SPDX-License-Identifier: Apache-2.0
// libotel_gpu_symtab.so: the function symbols of an ELF file's .symtab and .dynsym, sorted by address, without a
// Python object per symbol. It produces exactly what otel_gpu/symbolize/elf.py's ElfSymbols._read_symbols + _store
// produce (the reference the tests compare it with, file by file and on fuzzed files): the same symbols kept
// (STT_FUNC or STT_GNU_IFUNC, a value, a section, a name inside the string table), sorted by address, the largest
// size at an address kept, sizes clamped to 30 bits, names as file offsets. The name of an address is the one users
// know it by: the best binding (global, then weak, then local: glibc's __libc_start_main over its local
// __libc_start_main_alias_2 and __libc_start_main_impl), then among local symbols a name without a suffix the
// compiler or linker made (made_name; elf.py says why locals only), then the first read (.symtab before .dynsym, file
// order).
//
// The tables are read with pread (or from an in-memory image) in chunks of CHUNK_BYTES, never mapped or read whole:
// memory grows with the functions kept (16 bytes each while reading, as much again while one table is sorted), not
// with the file. Offsets and sizes come from the file, which any process on the node may have written: every read is
// clamped to the file's size as it was when opened, and a short read or a failed one ends the table with what was
// read (a failed one is reported, as the Python reader's OSError is).

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the reader decodes little-endian ELF files in place"
#endif

#define EXPORT __attribute__((visibility("default")))

enum { SYM_BYTES = 24, CHUNK_BYTES = 16384 * SYM_BYTES };  // elf.py's _SYM.size and _CHUNK_BYTES
enum { STT_FUNC = 2, STT_GNU_IFUNC = 10 };
enum { STB_GLOBAL = 1, STB_WEAK = 2 };
enum { LOCAL_RANK = 2 };  // elf.py's _LOCAL_RANK: after global (0) and weak (1)
#define MAX_SIZE 0x3FFFFFFFu  // elf.py's _MAX_SIZE: 30 bits, beside the binding's rank
#define MAX_NAME_BYTES (1u << 20)  // elf.py's _MAX_NAME_BYTES: a longer "name" is a corrupt string table
#define NAME_PROBE_BYTES 1024  // a name read on the stack first: C++ and Rust names are mostly shorter
#define TABLES 2  // .symtab, then .dynsym

// One elf.py _SYM entry (Elf64_Sym), as it lies in the file.
struct sym {
	uint32_t name;
	uint8_t info, other;
	uint16_t shndx;
	uint64_t value, size;
};
_Static_assert(sizeof(struct sym) == SYM_BYTES, "Elf64_Sym is 24 bytes");

// A kept function: the name is an offset into its table's string table (st_name is 32 bits), so 16 bytes do.
struct entry {
	uint64_t value;
	uint32_t name;
	uint32_t size : 30, rank : 2;  // rank: binding_rank
};
_Static_assert(sizeof(struct entry) == 16, "an entry is 16 bytes");

struct table_spec {
	uint64_t offset, size, str_offset, str_size;
};

struct table {
	struct entry *items;
	size_t count, capacity;
	uint64_t str_offset;
};

struct source {
	int fd;  // -1: read from image
	const uint8_t *image;
	uint64_t size;
};

struct symbols {
	struct table tables[TABLES];
	struct source src;  // where names are read from when two local symbols name an address (write)
	uint64_t count;  // after merging: one function per address
	uint64_t last_start;  // the highest start (0 without functions)
	int error;  // errno of a failed read, 0 if none
};

// Up to want bytes at offset (fewer at the end of the file), like _Source.read; -1 with errno on failure.
static int64_t source_read(const struct source *src, uint64_t offset, uint64_t want, uint8_t *out) {
	if (offset >= src->size || want == 0)
		return 0;
	if (want > src->size - offset)
		want = src->size - offset;
	if (src->fd < 0) {
		memcpy(out, src->image + offset, want);
		return (int64_t)want;
	}
	for (;;) {
		ssize_t got = pread(src->fd, out, want, (off_t)offset);
		if (got >= 0 || errno != EINTR)
			return got;
	}
}

static int table_push(struct table *t, uint64_t value, uint32_t name, uint32_t size, unsigned rank) {
	if (t->count == t->capacity) {
		size_t capacity = t->capacity ? t->capacity * 2 : 4096;
		struct entry *items = realloc(t->items, capacity * sizeof(*items));
		if (!items)
			return -1;
		t->items = items;
		t->capacity = capacity;
	}
	t->items[t->count++] = (struct entry){value, name, size, rank};
	return 0;
}

// elf.py's _BINDING_RANK: 0 for a global symbol, 1 for a weak one, LOCAL_RANK for any other binding.
static unsigned binding_rank(uint8_t info) {
	unsigned binding = info >> 4;
	return binding == STB_GLOBAL ? 0 : binding == STB_WEAK ? 1 : LOCAL_RANK;
}

// Appends the functions of one table (its first max_bytes at most) in file order; returns the bytes of table read,
// or -1 when memory runs out. A table that is not in the file (NOBITS in a debug-only file) is not read at all.
static int64_t read_table(const struct source *src, const struct table_spec *spec, uint64_t max_bytes,
			  struct table *t, uint8_t *chunk, int *error) {
	t->str_offset = spec->str_offset;
	if (spec->offset > src->size || spec->size > src->size - spec->offset || spec->str_offset > src->size ||
	    spec->str_size > src->size - spec->str_offset || spec->size % SYM_BYTES)
		return 0;
	uint64_t position = spec->offset;
	uint64_t span = spec->size < max_bytes / SYM_BYTES * SYM_BYTES ? spec->size : max_bytes / SYM_BYTES * SYM_BYTES;
	uint64_t end = spec->offset + span;
	while (position < end) {
		uint64_t want = end - position < CHUNK_BYTES ? end - position : CHUNK_BYTES;
		int64_t got = source_read(src, position, want, chunk);
		if (got < 0) {
			*error = errno ? errno : EIO;
			break;
		}
		if (got == 0 || got % SYM_BYTES)
			break;  // the file shrank under us: keep what was read
		position += (uint64_t)got;
		for (int64_t at = 0; at < got; at += SYM_BYTES) {
			struct sym s;
			memcpy(&s, chunk + at, sizeof(s));
			unsigned type = s.info & 0xF;
			if ((type != STT_FUNC && type != STT_GNU_IFUNC) || !s.value || !s.shndx || s.name >= spec->str_size)
				continue;
			if (table_push(t, s.value, s.name, s.size > MAX_SIZE ? MAX_SIZE : (uint32_t)s.size,
				       binding_rank(s.info)))
				return -1;
		}
	}
	return (int64_t)(position - spec->offset);
}

// Sorts a table's functions by address, stably (a least-significant-digit radix sort, skipping the bytes that are
// the same in every address: most of them in a shared library); -1 when memory runs out.
static int sort_table(struct table *t) {
	if (t->count < 2)
		return 0;
	size_t(*counts)[256] = calloc(8, sizeof(*counts));
	if (!counts)
		return -1;
	for (size_t i = 0; i < t->count; i++)
		for (int digit = 0; digit < 8; digit++)
			counts[digit][(t->items[i].value >> (8 * digit)) & 0xFF]++;
	struct entry *from = t->items, *to = NULL;
	for (int digit = 0; digit < 8; digit++) {
		size_t *count = counts[digit];
		if (count[(from[0].value >> (8 * digit)) & 0xFF] == t->count)
			continue;  // one value for this byte in every address: already in order
		if (!to && !(to = malloc(t->count * sizeof(*to)))) {
			free(counts);
			return -1;
		}
		size_t at = 0;
		for (int b = 0; b < 256; b++) {
			size_t n = count[b];
			count[b] = at;
			at += n;
		}
		for (size_t i = 0; i < t->count; i++)
			to[count[(from[i].value >> (8 * digit)) & 0xFF]++] = from[i];
		struct entry *swap = from;
		from = to;
		to = swap;
	}
	if (from != t->items) {  // an odd number of passes: the sorted entries are in the scratch buffer
		to = t->items;
		t->items = from;
		t->capacity = t->count;
	}
	free(to);
	free(counts);
	return 0;
}

// GCC's and LLVM's clone suffixes (foo.cold, foo.part.0, foo.isra.0, foo.constprop.0, foo.lto_priv.0,
// foo.localalias, foo.llvm.123, foo.__uniq.123): elf.py's _MADE_NAME.
static const char *const MADE_PARTS[] = {"cold", "part", "isra", "constprop", "lto_priv", "localalias", "llvm",
					 "__uniq"};

// elf.py's _MADE_NAME: whether a name was made by the compiler or linker from another one: a clone suffix follows
// a '.' as a whole '.'-separated part (not after "..", which separates a path in Rust's names: core..cold..f), or the
// name ends in _alias_<digits> (glibc's local aliases).
static int made_name(const uint8_t *name, size_t length) {
	static const char alias[] = "_alias_";
	size_t digits = 0;
	while (digits < length && name[length - 1 - digits] >= '0' && name[length - 1 - digits] <= '9')
		digits++;
	if (digits && length - digits >= sizeof(alias) - 1 &&
	    !memcmp(name + length - digits - (sizeof(alias) - 1), alias, sizeof(alias) - 1))
		return 1;
	const uint8_t *end = name + length, *dot = memchr(name, '.', length);
	while (dot) {
		const uint8_t *part = dot + 1, *next = memchr(part, '.', (size_t)(end - part));
		size_t part_length = (size_t)((next ? next : end) - part);
		if (dot == name || dot[-1] != '.')
			for (size_t k = 0; k < sizeof(MADE_PARTS) / sizeof(*MADE_PARTS); k++)
				if (strlen(MADE_PARTS[k]) == part_length && !memcmp(part, MADE_PARTS[k], part_length))
					return 1;
		dot = next;
	}
	return 0;
}

// made_name of the NUL-ended name at file offset `at`, read as elf.py's _read_name_bytes reads it: up to the NUL, the
// end of the file or MAX_NAME_BYTES, in reads 8 times longer each. A name that cannot be read (or not held) is not
// made, as the Python reader reads it as "".
static int made_name_at(const struct source *src, uint64_t at) {
	uint8_t probe[NAME_PROBE_BYTES], *name = probe, *held = NULL;
	uint64_t want = sizeof(probe);
	int made = 0;
	for (;;) {
		int64_t got = source_read(src, at, want, name);
		if (got < 0)
			break;
		const uint8_t *nul = memchr(name, 0, (size_t)got);
		if (nul || (uint64_t)got < want || want >= MAX_NAME_BYTES) {
			made = made_name(name, nul ? (size_t)(nul - name) : (size_t)got);
			break;
		}
		want = want * 8 < MAX_NAME_BYTES ? want * 8 : MAX_NAME_BYTES;
		uint8_t *grown = realloc(held, want);
		if (!grown)
			break;
		name = held = grown;
	}
	free(held);
	return made;
}

// The symbol that names an address among those of a group at it (elf.py's _store): the first of the best binding
// rank, and among local symbols the first whose name is not made (names read from src; without it, the first).
// group[k] is [begin, end) of table k's symbols at the address, .symtab's first, each in file order.
static uint64_t group_name(const struct symbols *s, const struct source *src, const struct entry *group[TABLES][2]) {
	unsigned rank = LOCAL_RANK;
	for (int k = 0; k < TABLES; k++)
		for (const struct entry *e = group[k][0]; e < group[k][1]; e++)
			if (e->rank < rank)
				rank = e->rank;
	uint64_t name = 0;
	int found = 0, made = -1;  // whether name is made: read once a second local symbol asks
	for (int k = 0; k < TABLES; k++) {
		for (const struct entry *e = group[k][0]; e < group[k][1]; e++) {
			uint64_t other = s->tables[k].str_offset + e->name;
			if (e->rank != rank || (found && (!src || rank != LOCAL_RANK || other == name || !made)))
				continue;
			if (!found) {
				name = other;
				found = 1;
				continue;
			}
			if (made < 0)
				made = made_name_at(src, name);
			if (made && !made_name_at(src, other)) {
				name = other;
				made = 0;
			}
		}
	}
	return name;
}

// Walks the two sorted tables by address, one function per address: the largest size at it and the name group_name
// chooses among the symbols at it (at one address .symtab's first, as a stable sort of .symtab then .dynsym gives).
// Names are read only to choose between two local symbols, and only when writing (src not NULL); without outputs,
// counts.
static uint64_t merge(const struct symbols *s, const struct source *src, uint64_t *starts8, uint32_t *starts4,
		      uint32_t *sizes, uint64_t *names8, uint32_t *names4) {
	const struct table *a = &s->tables[0], *b = &s->tables[1];
	size_t i = 0, j = 0;
	uint64_t kept = 0;
	while (i < a->count || j < b->count) {
		uint64_t value = j >= b->count || (i < a->count && a->items[i].value <= b->items[j].value) ?
				 a->items[i].value : b->items[j].value;
		size_t i_end = i, j_end = j;
		uint32_t size = 0;
		for (; i_end < a->count && a->items[i_end].value == value; i_end++)
			size = a->items[i_end].size > size ? a->items[i_end].size : size;
		for (; j_end < b->count && b->items[j_end].value == value; j_end++)
			size = b->items[j_end].size > size ? b->items[j_end].size : size;
		if (sizes) {
			uint64_t name;
			if (i_end - i + j_end - j == 1) {  // one symbol at the address, as at most
				name = i_end > i ? a->str_offset + a->items[i].name : b->str_offset + b->items[j].name;
			} else {
				const struct entry *group[TABLES][2] = {{a->items + i, a->items + i_end},
									{b->items + j, b->items + j_end}};
				name = group_name(s, src, group);
			}
			if (starts8)
				starts8[kept] = value;
			else
				starts4[kept] = (uint32_t)value;
			sizes[kept] = size;
			if (names8)
				names8[kept] = name;
			else
				names4[kept] = (uint32_t)name;
		}
		i = i_end;
		j = j_end;
		kept++;
	}
	return kept;
}

EXPORT void otel_gpu_symtab_release(struct symbols *s) {
	if (!s)
		return;
	for (int k = 0; k < TABLES; k++)
		free(s->tables[k].items);
	free(s);
}

// Reads the function symbols of up to two tables (specs[0]: .symtab, specs[1]: .dynsym; a table of size 0 is
// absent) from the open file fd, or from image when fd is -1, whose size is file_size; at most max_bytes of table in
// all, the first table's share read first. NULL when memory runs out.
EXPORT struct symbols *otel_gpu_symtab_read(int fd, const uint8_t *image, uint64_t file_size,
					    const struct table_spec *specs, int count, uint64_t max_bytes) {
	struct symbols *s = calloc(1, sizeof(*s));
	uint8_t *chunk = malloc(CHUNK_BYTES);
	if (!s || !chunk || count < 0 || count > TABLES)
		goto fail;
	s->src = (struct source){fd, image, file_size};
	if (fd < 0 && !image)
		s->src.size = 0;
	for (int k = 0; k < count && !s->error; k++) {
		int64_t read = read_table(&s->src, &specs[k], max_bytes, &s->tables[k], chunk, &s->error);
		if (read < 0)
			goto fail;
		max_bytes -= (uint64_t)read;
	}
	free(chunk);
	chunk = NULL;
	for (int k = 0; k < TABLES; k++)
		if (sort_table(&s->tables[k]))
			goto fail;
	s->count = merge(s, NULL, NULL, NULL, NULL, NULL, NULL);
	const struct table *a = &s->tables[0], *b = &s->tables[1];
	uint64_t last_a = a->count ? a->items[a->count - 1].value : 0, last_b = b->count ? b->items[b->count - 1].value : 0;
	s->last_start = last_a > last_b ? last_a : last_b;
	return s;
fail:
	free(chunk);
	otel_gpu_symtab_release(s);
	return NULL;
}

// The errno of a read that failed (the functions read before it are kept), 0 if none did.
EXPORT int otel_gpu_symtab_error(const struct symbols *s) { return s->error; }

// Functions kept: one per address.
EXPORT uint64_t otel_gpu_symtab_count(const struct symbols *s) { return s->count; }

// The highest function start, which decides whether 4-byte starts hold them all.
EXPORT uint64_t otel_gpu_symtab_last_start(const struct symbols *s) { return s->last_start; }

// Writes the count functions: starts (start_bytes 4 or 8 each, ascending), sizes (4 bytes) and the file offsets of
// their names (name_bytes 4 or 8 each). Each buffer must hold count items of its width; a start or name offset that
// does not fit its width is cut to it (the caller picks widths that fit: last_start, the file's size). Names may be
// read to choose between local symbols: the file (or image) read must still be open.
EXPORT void otel_gpu_symtab_write(const struct symbols *s, void *starts, int start_bytes, uint32_t *sizes, void *names,
				  int name_bytes) {
	merge(s, &s->src, start_bytes == 8 ? starts : NULL, start_bytes == 8 ? NULL : starts, sizes,
	      name_bytes == 8 ? names : NULL, name_bytes == 8 ? NULL : names);
}
