// SPDX-License-Identifier: Apache-2.0
// libotel_gpu_cfi.so: the unwind table of one .eh_frame / .debug_frame section, built without a Python object per
// row. It produces exactly the table of otel_gpu/unwind/cfi.py (parse_frames + table_from_fdes), the reference the
// tests compare it with, file by file and on fuzzed sections: the same rows, the same rule kinds, the same NONE
// gaps; a corrupt CIE or FDE is skipped, a corrupt entry length ends the section.
//
// Values are kept as Python keeps them: LEB128 numbers have up to 77 bits (the interpreter allows shifts up to 70),
// so they are decoded into 128-bit integers, and sums and products saturate far beyond any range a rule accepts
// (a saturated value fails the same range checks the exact one does). Every read is checked against the buffer the
// Python code reads from (the section, or the slice of an entry's instructions).

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef __int128 wide;
#define WIDE_MAX (((wide)1) << 120)
#define WIDE_MIN (-WIDE_MAX)

enum { RSP = 7, RBP = 6 };
enum { CFA_REG = 0, CFA_EXPR = 1 };
enum { SAME = 0, OFFSET = 1, UNDEFINED = 2, OTHER = 3 };
enum { KIND_NONE = 0, KIND_RSP = 1, KIND_RBP = 2, KIND_END = 3, KIND_UNSUPPORTED = 4 };
// A rule in 32 bits, from the low bits up: kind, rbp_offset, cfa_offset (cpu_profiler.h's OTEL_GPU_UNWIND_*_BITS)
enum { KIND_BITS = 3, RBP_BITS = 8, CFA_BITS = 21 };
#define MAX_STATE_STACK 64

struct buf {
	const uint8_t *data;
	uint64_t size;
};

struct state {
	int cfa_kind;
	wide cfa_reg, cfa_offset;
	int rbp_kind, ra_kind;
	wide rbp_offset, ra_offset;
};

struct cie {
	uint64_t at;  // offset of the entry in the section (the memo's key)
	int ok;
	wide code_align, data_align, ra_reg;
	uint8_t fde_encoding;
	int has_aug;
	uint64_t initial_pos, initial_end;  // the initial instructions: section[initial_pos:initial_end]
	int initial_ok;  // the initial instructions ran without error
	struct state initial;
};

struct vec {
	void *items;
	size_t count, capacity, item_size;
};

struct fde_entry {
	uint64_t start, end;
	uint64_t pos, entry_end;  // where its initial location and its instructions are, where it ends
	uint64_t cie_at;
	size_t seq;
};

struct otel_gpu_cfi_rows;
EXPORT void otel_gpu_cfi_release(struct otel_gpu_cfi_rows *rows);

struct row {
	wide pc;
	uint32_t rule;
};

struct builder {
	struct buf section;
	uint64_t section_vaddr;
	int is_eh;
	struct cie *cies;  // open addressing by offset
	size_t cie_slots, cie_count;
	struct vec fdes, scratch;
	int failed;  // out of memory
};

static wide sat(wide value)
{
	return value > WIDE_MAX ? WIDE_MAX : value < WIDE_MIN ? WIDE_MIN : value;
}

static wide sat_add(wide a, wide b)
{
	return sat(sat(a) + sat(b));
}

static wide sat_mul(wide a, wide b)
{
	wide out;
	a = sat(a);
	b = sat(b);
	if (__builtin_mul_overflow(a, b, &out))
		return (a < 0) != (b < 0) ? WIDE_MIN : WIDE_MAX;
	return sat(out);
}

static int push(struct builder *b, struct vec *v, const void *item)
{
	if (v->count == v->capacity) {
		size_t capacity = v->capacity ? v->capacity * 2 : 1024;
		void *grown = realloc(v->items, capacity * v->item_size);
		if (grown == NULL) {
			b->failed = 1;
			return -1;
		}
		v->items = grown;
		v->capacity = capacity;
	}
	memcpy((char *)v->items + v->count * v->item_size, item, v->item_size);
	v->count++;
	return 0;
}

// --- reading, as cfi.py reads: each returns -1 where Python raises --------------------------------------------------

static int byte_at(struct buf b, uint64_t pos, uint8_t *out)
{
	if (pos >= b.size)
		return -1;
	*out = b.data[pos];
	return 0;
}

static int fixed(struct buf b, uint64_t pos, unsigned bytes, uint64_t *out)
{
	uint64_t value = 0;
	if (pos > b.size || b.size - pos < bytes)
		return -1;
	for (unsigned i = 0; i < bytes; i++)
		value |= (uint64_t)b.data[pos + i] << (8 * i);
	*out = value;
	return 0;
}

// A LEB128's bits and its length in bits (7 a byte); -1 past 11 bytes (cfi._uleb's limit) or the buffer's end.
static int leb(struct buf b, uint64_t *pos, unsigned __int128 *bits, unsigned *length)
{
	unsigned __int128 result = 0;
	for (unsigned shift = 0; shift <= 70; shift += 7) {
		uint8_t byte;
		if (byte_at(b, (*pos)++, &byte))
			return -1;
		result |= (unsigned __int128)(byte & 0x7F) << shift;
		if (byte < 0x80) {
			*bits = result;
			*length = shift + 7;
			return 0;
		}
	}
	return -1;
}

static int uleb(struct buf b, uint64_t *pos, wide *out)
{
	unsigned __int128 bits;
	unsigned length;
	if (leb(b, pos, &bits, &length))
		return -1;
	*out = (wide)bits;
	return 0;
}

static int sleb(struct buf b, uint64_t *pos, wide *out)
{
	unsigned __int128 bits;
	unsigned length;
	if (leb(b, pos, &bits, &length))
		return -1;
	*out = (wide)bits;
	if ((bits >> (length - 1)) & 1)  // the last byte's sign bit
		*out -= (wide)1 << length;
	return 0;
}

// A DW_EH_PE-encoded pointer (cfi._pointer): the low 64 bits of the value, as Python masks it.
static int pointer(struct buf b, uint64_t *pos, unsigned encoding, uint64_t buffer_vaddr, uint64_t *out)
{
	uint64_t start = *pos, value;
	wide leb;
	if (encoding == 0xFF) {
		*out = 0;
		return 0;
	}
	switch (encoding & 0x0F) {
	case 0x00: case 0x04: case 0x0C:
		if (fixed(b, *pos, 8, &value))
			return -1;
		*pos += 8;
		break;
	case 0x01:
		if (uleb(b, pos, &leb))
			return -1;
		value = (uint64_t)leb;
		break;
	case 0x09:
		if (sleb(b, pos, &leb))
			return -1;
		value = (uint64_t)leb;
		break;
	case 0x02: case 0x0A: case 0x03: case 0x0B: {
		unsigned bits = (encoding & 0x07) == 0x02 ? 16 : 32;  // udata2/sdata2, udata4/sdata4
		if (fixed(b, *pos, bits / 8, &value))
			return -1;
		if (encoding & 0x08)  // signed: extend the top bit
			value = (uint64_t)((int64_t)(value << (64 - bits)) >> (64 - bits));
		*pos += bits / 8;
		break;
	}
	default:
		return -1;
	}
	switch (encoding & 0x70) {
	case 0x10:
		value += buffer_vaddr + start;
		break;
	case 0x00:
		break;
	default:
		return -1;
	}
	*out = value;
	return 0;
}

// --- the call frame instructions (cfi._execute) -----------------------------------------------------------------

static void default_state(struct state *s)
{
	memset(s, 0, sizeof(*s));
	s->cfa_kind = CFA_REG;
	s->cfa_reg = RSP;
	s->cfa_offset = 8;
	s->rbp_kind = SAME;
	s->ra_kind = SAME;
}

static uint32_t pack(int kind, wide cfa_offset, wide rbp_offset)
{
	return ((uint32_t)kind & ((1U << KIND_BITS) - 1)) |
	       (((uint32_t)rbp_offset & ((1U << RBP_BITS) - 1)) << KIND_BITS) |
	       (((uint32_t)cfa_offset & ((1U << CFA_BITS) - 1)) << (KIND_BITS + RBP_BITS));
}

// Whether value fits a signed field of bits bits.
static int fits(wide value, unsigned bits)
{
	return value >= -((wide)1 << (bits - 1)) && value < ((wide)1 << (bits - 1));
}

// cfi.rule_of
static uint32_t rule_of(const struct state *s)
{
	if (s->ra_kind == UNDEFINED)
		return pack(KIND_END, 0, 0);
	if (s->cfa_kind != CFA_REG || (s->cfa_reg != RSP && s->cfa_reg != RBP) || s->ra_kind != OFFSET ||
	    s->ra_offset != -8 || s->rbp_kind == OTHER || !fits(s->cfa_offset, CFA_BITS) ||
	    !fits(s->rbp_offset, RBP_BITS) || (s->rbp_kind == OFFSET && s->rbp_offset == 0))
		return pack(KIND_UNSUPPORTED, 0, 0);
	return pack(s->cfa_reg == RSP ? KIND_RSP : KIND_RBP, s->cfa_offset,
		    s->rbp_kind == OFFSET ? s->rbp_offset : 0);
}

struct run {
	struct builder *b;
	const struct cie *cie;
	struct state *state;
	const struct state *initial;  // NULL: the default state (the CIE's own instructions)
	wide pc;
	struct vec *rows;  // NULL: rows are not kept (the CIE's own instructions)
};

static void set_reg(struct run *r, wide reg, int kind, wide offset)
{
	if (reg == RBP) {
		r->state->rbp_kind = kind;
		r->state->rbp_offset = offset;
	} else if (reg == r->cie->ra_reg) {
		r->state->ra_kind = kind;
		r->state->ra_offset = offset;
	}
}

static void restore(struct run *r, wide reg)
{
	struct state base;
	if (r->initial != NULL)
		base = *r->initial;
	else
		default_state(&base);
	if (reg == RBP) {
		r->state->rbp_kind = base.rbp_kind;
		r->state->rbp_offset = base.rbp_offset;
	} else if (reg == r->cie->ra_reg) {
		r->state->ra_kind = base.ra_kind;
		r->state->ra_offset = base.ra_offset;
	}
}

static int advance(struct run *r, wide new_pc)
{
	if (new_pc != r->pc && r->rows != NULL) {
		struct row row = {r->pc, rule_of(r->state)};
		struct row *rows = r->rows->items;
		if (r->rows->count && rows[r->rows->count - 1].pc == r->pc)
			rows[r->rows->count - 1] = row;
		else if (push(r->b, r->rows, &row))
			return -1;
	}
	r->pc = new_pc;
	return 0;
}

// Runs code[0:size) (at section offset code_vaddr for pc-relative set_loc); -1 on anything cfi.py raises for.
static int execute(struct run *r, struct buf code, uint64_t code_vaddr)
{
	struct state stack[MAX_STATE_STACK];
	unsigned depth = 0;
	uint64_t pos = 0, value64;
	const struct cie *cie = r->cie;
	struct state *s = r->state;
	wide reg, value, ignored;
	uint8_t op, byte;

	while (pos < code.size) {
		op = code.data[pos++];
		uint8_t low = op & 0x3F;
		switch (op & 0xC0) {
		case 0x40:
			if (advance(r, sat_add(r->pc, sat_mul(low, cie->code_align))))
				return -1;
			continue;
		case 0x80:
			if (uleb(code, &pos, &value))
				return -1;
			set_reg(r, low, OFFSET, sat_mul(value, cie->data_align));
			continue;
		case 0xC0:
			restore(r, low);
			continue;
		}
		switch (op) {
		case 0x00:
			break;
		case 0x01:
			if (pointer(code, &pos, cie->fde_encoding, code_vaddr, &value64) || advance(r, value64))
				return -1;
			break;
		case 0x02:
			if (byte_at(code, pos, &byte))
				return -1;
			pos += 1;
			if (advance(r, sat_add(r->pc, sat_mul(byte, cie->code_align))))
				return -1;
			break;
		case 0x03:
		case 0x04: {
			unsigned bytes = op == 0x03 ? 2 : 4;
			if (fixed(code, pos, bytes, &value64))
				return -1;
			pos += bytes;
			if (advance(r, sat_add(r->pc, sat_mul(value64, cie->code_align))))
				return -1;
			break;
		}
		case 0x05:
			if (uleb(code, &pos, &reg) || uleb(code, &pos, &value))
				return -1;
			set_reg(r, reg, OFFSET, sat_mul(value, cie->data_align));
			break;
		case 0x06:
			if (uleb(code, &pos, &reg))
				return -1;
			restore(r, reg);
			break;
		case 0x07:
			if (uleb(code, &pos, &reg))
				return -1;
			if (reg == cie->ra_reg)
				set_reg(r, reg, UNDEFINED, 0);
			else
				set_reg(r, reg, SAME, 0);
			break;
		case 0x08:
			if (uleb(code, &pos, &reg))
				return -1;
			set_reg(r, reg, SAME, 0);
			break;
		case 0x09:
			if (uleb(code, &pos, &reg) || uleb(code, &pos, &ignored))
				return -1;
			set_reg(r, reg, OTHER, 0);
			break;
		case 0x0A:
			if (depth >= MAX_STATE_STACK)
				return -1;
			stack[depth++] = *s;
			break;
		case 0x0B:
			if (depth == 0)
				return -1;
			*s = stack[--depth];  // every rule, the CFA's too (as cfi.py)
			break;
		case 0x0C:
			if (uleb(code, &pos, &s->cfa_reg) || uleb(code, &pos, &s->cfa_offset))
				return -1;
			s->cfa_kind = CFA_REG;
			break;
		case 0x0D:
			if (uleb(code, &pos, &s->cfa_reg))
				return -1;
			s->cfa_kind = CFA_REG;
			break;
		case 0x0E:
			if (uleb(code, &pos, &s->cfa_offset))
				return -1;
			break;
		case 0x0F:
			if (uleb(code, &pos, &value))
				return -1;
			pos = sat_add(pos, value) > (wide)code.size ? code.size : (uint64_t)sat_add(pos, value);
			s->cfa_kind = CFA_EXPR;
			break;
		case 0x10:
		case 0x16:
			if (uleb(code, &pos, &reg) || uleb(code, &pos, &value))
				return -1;
			pos = sat_add(pos, value) > (wide)code.size ? code.size : (uint64_t)sat_add(pos, value);
			set_reg(r, reg, OTHER, 0);
			break;
		case 0x11:
			if (uleb(code, &pos, &reg) || sleb(code, &pos, &value))
				return -1;
			set_reg(r, reg, OFFSET, sat_mul(value, cie->data_align));
			break;
		case 0x12:
			if (uleb(code, &pos, &s->cfa_reg) || sleb(code, &pos, &value))
				return -1;
			s->cfa_offset = sat_mul(value, cie->data_align);
			s->cfa_kind = CFA_REG;
			break;
		case 0x13:
			if (sleb(code, &pos, &value))
				return -1;
			s->cfa_offset = sat_mul(value, cie->data_align);
			break;
		case 0x14:
			if (uleb(code, &pos, &reg) || uleb(code, &pos, &ignored))
				return -1;
			set_reg(r, reg, OTHER, 0);
			break;
		case 0x15:
			if (uleb(code, &pos, &reg) || sleb(code, &pos, &ignored))
				return -1;
			set_reg(r, reg, OTHER, 0);
			break;
		case 0x2E:
			if (uleb(code, &pos, &ignored))
				return -1;
			break;
		case 0x2F:
			if (uleb(code, &pos, &reg) || uleb(code, &pos, &value))
				return -1;
			set_reg(r, reg, OFFSET, sat_mul(-value, cie->data_align));
			break;
		default:
			return -1;
		}
	}
	return 0;
}

// --- entries (cfi._read_cie, cfi._cie_at, cfi._read_fde, cfi.parse_frames) --------------------------------------

static struct buf slice(struct buf b, uint64_t from, uint64_t to)
{
	struct buf out = {b.data, 0};
	if (to > b.size)
		to = b.size;
	if (from < to) {
		out.data = b.data + from;
		out.size = to - from;
	}
	return out;
}

static int read_cie(struct builder *b, uint64_t pos, uint64_t end, struct cie *cie)
{
	struct buf d = b->section;
	uint8_t version, letter, encoding;
	uint64_t nul, aug_start, ignored;
	wide value;

	if (byte_at(d, pos, &version))
		return -1;
	pos += 1;
	for (nul = pos; nul < end && nul < d.size && d.data[nul] != 0; nul++)
		;
	if (nul >= end || nul >= d.size)
		return -1;
	aug_start = pos;
	pos = nul + 1;
	if (!b->is_eh && version >= 4) {
		if (byte_at(d, pos, &letter))
			return -1;
		pos += 2;
	}
	if (uleb(d, &pos, &cie->code_align) || sleb(d, &pos, &cie->data_align))
		return -1;
	if (version == 1) {
		if (byte_at(d, pos, &letter))
			return -1;
		cie->ra_reg = letter;
		pos += 1;
	} else if (uleb(d, &pos, &cie->ra_reg)) {
		return -1;
	}
	cie->fde_encoding = 0x00;
	cie->has_aug = nul > aug_start && d.data[aug_start] == 'z';
	if (cie->has_aug) {
		uint64_t aug_end;
		if (uleb(d, &pos, &value))
			return -1;
		aug_end = (uint64_t)(sat_add(pos, value) > (wide)UINT64_MAX ? UINT64_MAX : sat_add(pos, value));
		for (uint64_t at = aug_start + 1; at < nul; at++) {
			letter = d.data[at];
			if (letter == 'R' || letter == 'L') {
				if (byte_at(d, pos, &encoding))
					return -1;
				if (letter == 'R')
					cie->fde_encoding = encoding;
				pos += 1;
			} else if (letter == 'P') {
				if (byte_at(d, pos, &encoding))
					return -1;
				pos += 1;
				if (pointer(d, &pos, encoding & 0x7F, 0, &ignored))
					return -1;
			} else if (letter != 'S' && letter != 'B') {
				break;
			}
		}
		pos = aug_end;
	} else if (nul > aug_start) {
		return -1;  // an augmentation this reader does not know
	}
	cie->initial_pos = pos;
	cie->initial_end = end;
	return 0;
}

// The CIE's initial instructions, run once: the state each FDE starts from (cfi._read_fde runs them per FDE, with
// the same result each time).
static void run_initial(struct builder *b, struct cie *cie)
{
	struct run r = {b, cie, &cie->initial, NULL, 0, NULL};
	default_state(&cie->initial);
	cie->initial_ok = execute(&r, slice(b->section, cie->initial_pos, cie->initial_end), 0) == 0;
}

static struct cie *cie_slot(struct builder *b, uint64_t at)
{
	size_t mask = b->cie_slots - 1, index = (size_t)((at * 0x9E3779B97F4A7C15ull) >> 20) & mask;
	while (b->cies[index].at != UINT64_MAX && b->cies[index].at != at)
		index = (index + 1) & mask;
	return &b->cies[index];
}

static int grow_cies(struct builder *b)
{
	struct cie *old = b->cies;
	size_t old_slots = b->cie_slots;
	b->cie_slots = old_slots ? old_slots * 2 : 64;
	b->cies = malloc(b->cie_slots * sizeof(*b->cies));
	if (b->cies == NULL) {
		b->failed = 1;
		b->cies = old;
		b->cie_slots = old_slots;
		return -1;
	}
	for (size_t i = 0; i < b->cie_slots; i++)
		b->cies[i].at = UINT64_MAX;
	for (size_t i = 0; i < old_slots; i++)
		if (old[i].at != UINT64_MAX)
			*cie_slot(b, old[i].at) = old[i];
	free(old);
	return 0;
}

static struct cie *remember_cie(struct builder *b, uint64_t at, struct cie *parsed)
{
	struct cie *slot;
	if ((b->cie_count + 1) * 2 > b->cie_slots && grow_cies(b))
		return NULL;
	slot = cie_slot(b, at);
	if (slot->at == UINT64_MAX)
		b->cie_count++;
	parsed->at = at;
	if (parsed->ok)
		run_initial(b, parsed);
	*slot = *parsed;
	return slot;
}

// cfi._cie_at: the CIE an FDE points at, read from wherever it points (memoized)
static struct cie *cie_at(struct builder *b, uint64_t at)
{
	struct buf d = b->section;
	struct cie parsed = {0};
	struct cie *slot;
	uint64_t length, pos = at + 4, end;
	unsigned offset_size = 4;

	if (b->cie_slots) {
		slot = cie_slot(b, at);
		if (slot->at == at)
			return slot;
	}
	if (fixed(d, at, 4, &length) == 0) {
		parsed.ok = 1;
		if (length == 0xFFFFFFFF) {
			offset_size = 8;
			if (fixed(d, pos, 8, &length))
				parsed.ok = 0;
			pos += 8;
		}
		if (parsed.ok) {
			end = length > d.size - (pos < d.size ? pos : d.size) ? d.size : pos + length;
			parsed.ok = read_cie(b, pos + offset_size, end, &parsed) == 0;
		}
	}
	return remember_cie(b, at, &parsed);
}

// cfi._read_fde: runs the FDE at pos (its initial location) to end; 1 with its rows in b->scratch and its range in
// *start, *span; 0 when it is skipped; -1 when memory ran out.
static int run_fde(struct builder *b, uint64_t pos, uint64_t end, const struct cie *cie, uint64_t *start,
		   uint64_t *span)
{
	struct buf d = b->section;
	wide aug_len;
	struct state state;

	if (b->is_eh) {
		if (pointer(d, &pos, cie->fde_encoding, b->section_vaddr, start) ||
		    pointer(d, &pos, cie->fde_encoding & 0x0F, 0, span))
			return 0;
	} else {
		if (fixed(d, pos, 8, start) || fixed(d, pos + 8, 8, span))
			return 0;
		pos += 16;
	}
	if (cie->has_aug) {
		if (uleb(d, &pos, &aug_len))
			return 0;
		pos = (uint64_t)(sat_add(pos, aug_len) > (wide)UINT64_MAX ? UINT64_MAX : sat_add(pos, aug_len));
	}
	if (*span == 0 || *start == 0 || *start + *span < *start)
		return 0;  // discarded (start 0, zero length) or past the address space
	if (!cie->initial_ok)
		return 0;
	state = cie->initial;
	b->scratch.count = 0;
	struct run r = {b, cie, &state, &cie->initial, *start, &b->scratch};
	if (execute(&r, slice(d, pos, end), b->section_vaddr + pos))
		return b->failed ? -1 : 0;
	if (advance(&r, r.pc + 1))  // the last row: cfi._read_fde appends (or replaces) the row at the final pc
		return -1;
	return 1;
}

// Keeps a valid FDE's place, range and CIE; its rows are made again when the table is written (so a large file
// costs about 48 bytes per FDE here, not 16 per row).
static int read_fde(struct builder *b, uint64_t pos, uint64_t end, const struct cie *cie)
{
	uint64_t start, span;
	int found = run_fde(b, pos, end, cie, &start, &span);
	if (found <= 0)
		return found;
	struct fde_entry entry = {start, start + span, pos, end, cie->at, b->fdes.count};
	return push(b, &b->fdes, &entry);
}

static int parse(struct builder *b)
{
	struct buf d = b->section;
	uint64_t pos = 0, length = 0, id;
	while (d.size >= 4 && pos <= d.size - 4) {
		uint64_t start = pos, end, id_pos;
		unsigned offset_size = 4;
		fixed(d, pos, 4, &length);
		pos += 4;
		if (length == 0) {
			if (b->is_eh)
				break;
			continue;
		}
		if (length == 0xFFFFFFFF) {
			if (fixed(d, pos, 8, &length))
				break;
			pos += 8;
			offset_size = 8;
		}
		if (length > d.size - pos)
			break;
		end = pos + length;
		id_pos = pos;
		if (fixed(d, pos, offset_size, &id))
			break;  // the id runs past the section: as corrupt as a length that does
		pos += offset_size;
		int is_cie = b->is_eh ? id == 0 : (id == 0xFFFFFFFF || id == UINT64_MAX);
		if (is_cie) {
			struct cie parsed = {0};
			parsed.ok = read_cie(b, pos, end, &parsed) == 0;
			if (remember_cie(b, start, &parsed) == NULL)
				return -1;
			pos = end;
			continue;
		}
		uint64_t at = b->is_eh ? id_pos - id : id;
		pos = end;
		if (b->is_eh && id > id_pos)
			continue;  // points before the section
		const struct cie *cie = cie_at(b, at);
		if (cie == NULL)
			return -1;
		if (cie->ok && read_fde(b, id_pos + offset_size, end, cie))
			return -1;
	}
	return 0;
}

// --- the table (table.table_from_fdes) --------------------------------------------------------------------------

static int by_start(const void *a, const void *b)
{
	const struct fde_entry *x = a, *y = b;
	if (x->start != y->start)
		return x->start < y->start ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;  // stable: section order
}

// Where merge() writes the table: two arrays, or struct otel_gpu_unwind_row[] as unwind_rows holds them (each pc as
// its offset from base); neither when it only counts.
struct sink {
	uint64_t *pcs;  // pc i at pcs[i], its rule at rules[i]
	uint32_t *rules;
	uint32_t *rows;  // pc i - base at rows[2 * i], its rule at rows[2 * i + 1]
	uint64_t base;
};

static void put(const struct sink *out, uint64_t index, uint64_t pc, uint32_t rule)
{
	if (out->rows != NULL) {
		out->rows[2 * index] = (uint32_t)(pc - out->base);
		out->rows[2 * index + 1] = rule;
	} else if (out->pcs != NULL) {
		out->pcs[index] = pc;
		out->rules[index] = rule;
	}
}

// Walks the FDEs in pc order as table_from_fdes does, running each again, and writes the rows to out. Returns the
// number of rows (the same on every walk: the runs are the ones parse() made, into a scratch buffer already as large
// as they need); *first_pc and *last_pc are the first and the last row's pc.
static uint64_t merge(struct builder *b, const struct sink *out, uint64_t *first_pc, uint64_t *last_pc)
{
	const struct fde_entry *fdes = b->fdes.items;
	uint64_t count = 0, covered_to = 0, last = 0, start, span;
	uint32_t last_rule = 0;
	*first_pc = 0;
#define EMIT(pc, rule)                                          \
	do {                                                    \
		last = (pc);                                    \
		last_rule = (rule);                             \
		if (count == 0)                                 \
			*first_pc = last;                       \
		put(out, count, last, last_rule);               \
		count++;                                        \
	} while (0)
	for (size_t i = 0; i < b->fdes.count; i++) {
		if (fdes[i].start < covered_to)
			continue;  // overlapping FDEs: the first one wins
		if (count && fdes[i].start > covered_to && last_rule != KIND_NONE)
			EMIT(covered_to, KIND_NONE);
		if (run_fde(b, fdes[i].pos, fdes[i].entry_end, cie_slot(b, fdes[i].cie_at), &start, &span) != 1)
			continue;  // cannot happen: it ran the same way in parse()
		const struct row *rows = b->scratch.items;
		for (size_t at = 0; at < b->scratch.count; at++) {
			if (rows[at].pc >= (wide)fdes[i].end)
				continue;
			uint64_t pc = (uint64_t)rows[at].pc;
			uint32_t rule = rows[at].rule;
			if (count && last_rule == rule)
				continue;
			if (count && last == pc) {
				last_rule = rule;
				put(out, count - 1, last, last_rule);
				continue;
			}
			EMIT(pc, rule);
		}
		covered_to = fdes[i].end;
	}
	if (count)
		EMIT(covered_to, KIND_NONE);
#undef EMIT
	*last_pc = last;
	return count;
}

// What otel_gpu_cfi_parse hands back: the parsed FDEs and their rows, sorted, and the table's row count.
struct otel_gpu_cfi_rows {
	struct builder b;
	uint64_t count;
	uint64_t first_pc, last_pc;  // the table's base and its last row's pc
};

// Parses the frame section data[0:size) (loaded at section_vaddr; is_eh: .eh_frame, else .debug_frame); NULL when
// memory ran out. The caller keeps data alive until otel_gpu_cfi_release (the rows are made from it when written).
EXPORT struct otel_gpu_cfi_rows *otel_gpu_cfi_parse(const uint8_t *data, uint64_t size, uint64_t section_vaddr,
						    int is_eh)
{
	struct otel_gpu_cfi_rows *rows = calloc(1, sizeof(*rows));
	struct builder *b;
	if (rows == NULL)
		return NULL;
	b = &rows->b;
	b->section = (struct buf){data, size};
	b->section_vaddr = section_vaddr;
	b->is_eh = is_eh != 0;
	b->fdes.item_size = sizeof(struct fde_entry);
	b->scratch.item_size = sizeof(struct row);
	if (parse(b) || b->failed) {
		otel_gpu_cfi_release(rows);
		return NULL;
	}
	if (b->fdes.count > 1)
		qsort(b->fdes.items, b->fdes.count, sizeof(struct fde_entry), by_start);
	rows->count = merge(b, &(struct sink){0}, &rows->first_pc, &rows->last_pc);
	return rows;
}

// The table's number of rows.
EXPORT uint64_t otel_gpu_cfi_count(const struct otel_gpu_cfi_rows *rows)
{
	return rows->count;
}

// The table's base: its first row's pc (0 without rows).
EXPORT uint64_t otel_gpu_cfi_base(const struct otel_gpu_cfi_rows *rows)
{
	return rows->first_pc;
}

// The distance from the table's base to its last row's pc: unwind_rows holds the table only when it fits in 32 bits.
EXPORT uint64_t otel_gpu_cfi_span(const struct otel_gpu_cfi_rows *rows)
{
	return rows->last_pc - rows->first_pc;
}

// Writes the table's count rows into two arrays: pc i (link-time) at pcs[i], its packed rule at rules[i].
EXPORT void otel_gpu_cfi_arrays(struct otel_gpu_cfi_rows *rows, uint64_t *pcs, uint32_t *rules)
{
	uint64_t first, last;
	merge(&rows->b, &(struct sink){.pcs = pcs, .rules = rules}, &first, &last);
}

// Writes the table's count rows as struct otel_gpu_unwind_row[] (8 bytes each: the pc less the base, the packed
// rule); -1 and nothing written when the span does not fit in 32 bits.
EXPORT int otel_gpu_cfi_write(struct otel_gpu_cfi_rows *rows, uint32_t *out)
{
	uint64_t first, last;
	if (otel_gpu_cfi_span(rows) > UINT32_MAX)
		return -1;
	merge(&rows->b, &(struct sink){.rows = out, .base = rows->first_pc}, &first, &last);
	return 0;
}

EXPORT void otel_gpu_cfi_release(struct otel_gpu_cfi_rows *rows)
{
	if (rows == NULL)
		return;
	free(rows->b.cies);
	free(rows->b.fdes.items);
	free(rows->b.scratch.items);
	free(rows);
}
