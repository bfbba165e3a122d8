// SPDX-License-Identifier: Apache-2.0
// libotel_gpu_symtab.so: the function symbols of an ELF file's .symtab and .dynsym, sorted by address, without a
// Python object per symbol. It produces exactly what otel_gpu/symbolize/elf.py's ElfSymbols._read_symbols + _store
// produce (the reference the tests compare it with, file by file and on fuzzed files): the same symbols kept
// (STT_FUNC or STT_GNU_IFUNC, a value, a section, a name inside the string table), sorted by address, the first
// symbol read naming an address and the largest size kept, sizes clamped to 32 bits, names as file offsets.
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
#define MAX_SIZE 0xFFFFFFFFu
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
	uint32_t name, size;
};

struct table_spec {
	uint64_t offset, size, str_offset, str_size;
};

struct table {
	struct entry *items;
	size_t count, capacity;
	uint64_t str_offset;
};

struct symbols {
	struct table tables[TABLES];
	uint64_t count;  // after merging: one function per address
	uint64_t last_start;  // the highest start (0 without functions)
	int error;  // errno of a failed read, 0 if none
};

struct source {
	int fd;  // -1: read from image
	const uint8_t *image;
	uint64_t size;
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

static int table_push(struct table *t, uint64_t value, uint32_t name, uint32_t size) {
	if (t->count == t->capacity) {
		size_t capacity = t->capacity ? t->capacity * 2 : 4096;
		struct entry *items = realloc(t->items, capacity * sizeof(*items));
		if (!items)
			return -1;
		t->items = items;
		t->capacity = capacity;
	}
	t->items[t->count++] = (struct entry){value, name, size};
	return 0;
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
			if (table_push(t, s.value, s.name, s.size > MAX_SIZE ? MAX_SIZE : (uint32_t)s.size))
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

// Walks the two sorted tables in the order a stable sort of .symtab then .dynsym gives (at one address, .symtab's
// functions first), one function per address: the first one's name, the largest size. Without outputs, counts.
static uint64_t merge(const struct symbols *s, uint64_t *starts8, uint32_t *starts4, uint32_t *sizes,
		      uint64_t *names8, uint32_t *names4) {
	const struct table *a = &s->tables[0], *b = &s->tables[1];
	size_t i = 0, j = 0;
	uint64_t kept = 0, last = 0;
	while (i < a->count || j < b->count) {
		const struct entry *e;
		uint64_t str_offset;
		if (j >= b->count || (i < a->count && a->items[i].value <= b->items[j].value)) {
			e = &a->items[i++];
			str_offset = a->str_offset;
		} else {
			e = &b->items[j++];
			str_offset = b->str_offset;
		}
		if (kept && e->value == last) {
			if (sizes && e->size > sizes[kept - 1])
				sizes[kept - 1] = e->size;
			continue;
		}
		last = e->value;
		if (sizes) {
			if (starts8)
				starts8[kept] = e->value;
			else
				starts4[kept] = (uint32_t)e->value;
			sizes[kept] = e->size;
			if (names8)
				names8[kept] = str_offset + e->name;
			else
				names4[kept] = (uint32_t)(str_offset + e->name);
		}
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
	struct source src = {fd, image, file_size};
	if (fd < 0 && !image)
		src.size = 0;
	for (int k = 0; k < count && !s->error; k++) {
		int64_t read = read_table(&src, &specs[k], max_bytes, &s->tables[k], chunk, &s->error);
		if (read < 0)
			goto fail;
		max_bytes -= (uint64_t)read;
	}
	free(chunk);
	chunk = NULL;
	for (int k = 0; k < TABLES; k++)
		if (sort_table(&s->tables[k]))
			goto fail;
	s->count = merge(s, NULL, NULL, NULL, NULL, NULL);
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
// does not fit its width is cut to it (the caller picks widths that fit: last_start, the file's size).
EXPORT void otel_gpu_symtab_write(const struct symbols *s, void *starts, int start_bytes, uint32_t *sizes, void *names,
				  int name_bytes) {
	merge(s, start_bytes == 8 ? starts : NULL, start_bytes == 8 ? NULL : starts, sizes,
	      name_bytes == 8 ? names : NULL, name_bytes == 8 ? NULL : names);
}
