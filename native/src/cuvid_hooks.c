/*
 * NVDEC (libnvcuvid.so.1): video decoders are part of the slice.
 *
 * A decoder's surfaces live in GPU memory the driver allocates internally,
 * out of sight of the memory hooks: they are charged here from the create
 * parameters (decoder_bytes, docs/nvdec.md) and credited on destroy. The
 * number of live decoders per GPU is capped by the slice's max_decoders.
 * Decode submissions wait for the slice's SM window like kernel launches.
 * Each process counts its decoders, frames decoded and mapped, and the time
 * spent in cuvidDecodePicture, in its slot.
 */
#include <stdint.h>
#include <string.h>

#include "hami.h"
#include "hami/cuvid_types.h"


typedef CUresult (*create_fn)(CUvideodecoder *, CUVIDDECODECREATEINFO *);
typedef CUresult (*destroy_fn)(CUvideodecoder);
typedef CUresult (*decode_fn)(CUvideodecoder, CUVIDPICPARAMS *);
typedef CUresult (*map64_fn)(CUvideodecoder, int, unsigned long long *, unsigned int *, CUVIDPROCPARAMS *);
typedef CUresult (*map32_fn)(CUvideodecoder, int, unsigned int *, unsigned int *, CUVIDPROCPARAMS *);
typedef CUresult (*unmap64_fn)(CUvideodecoder, unsigned long long);
typedef CUresult (*unmap32_fn)(CUvideodecoder, unsigned int);
typedef CUresult (*reconfigure_fn)(CUvideodecoder, CUVIDRECONFIGUREDECODERINFO *);
typedef CUresult (*caps_fn)(CUVIDDECODECAPS *);
typedef CUresult (*parser_create_fn)(CUvideoparser *, CUVIDPARSERPARAMS *);
typedef CUresult (*parser_destroy_fn)(CUvideoparser);

/* The head of CUVIDRECONFIGUREDECODERINFO: the only fields read here. */
struct reconfigure_head {
	unsigned int ulWidth;
	unsigned int ulHeight;
	unsigned int ulTargetWidth;
	unsigned int ulTargetHeight;
	unsigned int ulNumDecodeSurfaces;
};

/* ---- the memory estimate ------------------------------------------------------ */

static uint64_t round_up(uint64_t v, uint64_t to)
{
	return (v + to - 1) / to * to;
}

/* One surface: luma rows of 64-byte-aligned width, 16-row-aligned height, plus chroma. */
static uint64_t surface_bytes(uint64_t w, uint64_t h, int chroma, int wide)
{
	uint64_t luma = round_up(w * (wide ? 2 : 1), 64) * round_up(h, 16);
	switch (chroma) {
	case cudaVideoChromaFormat_Monochrome:
		return luma;
	case cudaVideoChromaFormat_422:
		return luma * 2;
	case cudaVideoChromaFormat_444:
		return luma * 3;
	default: /* 4:2:0 */
		return luma + luma / 2;
	}
}

static int output_chroma(int format)
{
	switch (format) {
	case cudaVideoSurfaceFormat_YUV444:
	case cudaVideoSurfaceFormat_YUV444_16Bit:
		return cudaVideoChromaFormat_444;
	case cudaVideoSurfaceFormat_NV16:
	case cudaVideoSurfaceFormat_P216:
		return cudaVideoChromaFormat_422;
	default:
		return cudaVideoChromaFormat_420;
	}
}

static int output_wide(int format)
{
	return format == cudaVideoSurfaceFormat_P016 || format == cudaVideoSurfaceFormat_YUV444_16Bit ||
	       format == cudaVideoSurfaceFormat_P216;
}

/*
 * Decode surfaces at the largest coded size the decoder may be reconfigured
 * to, plus output surfaces at the target size. Counts are clamped so that a
 * garbage value cannot overflow; the driver refuses such values anyway.
 */
static uint64_t decoder_bytes(uint64_t w, uint64_t h, uint64_t surfaces, int chroma, int wide,
			      uint64_t tw, uint64_t th, uint64_t outputs, int out_format)
{
	if (w > 65536 || h > 65536 || tw > 65536 || th > 65536)
		return UINT64_MAX;
	uint64_t decode = surface_bytes(w, h, chroma, wide) * (surfaces > 1024 ? 1024 : surfaces);
	uint64_t output = surface_bytes(tw, th, output_chroma(out_format), output_wide(out_format)) *
			  (outputs > 1024 ? 1024 : outputs);
	return decode + output;
}

static uint64_t create_bytes(const CUVIDDECODECREATEINFO *ci)
{
	uint64_t w = ci->ulMaxWidth > ci->ulWidth ? ci->ulMaxWidth : ci->ulWidth;
	uint64_t h = ci->ulMaxHeight > ci->ulHeight ? ci->ulMaxHeight : ci->ulHeight;
	uint64_t tw = ci->ulTargetWidth ? ci->ulTargetWidth : ci->ulWidth;
	uint64_t th = ci->ulTargetHeight ? ci->ulTargetHeight : ci->ulHeight;
	return decoder_bytes(w, h, ci->ulNumDecodeSurfaces, ci->ChromaFormat, ci->bitDepthMinus8 > 0, tw, th,
			     ci->ulNumOutputSurfaces, ci->OutputFormat);
}

/* ---- per-decoder records -------------------------------------------------- */

/* What a reconfigure needs to re-estimate: kept in the record's pool field. */
struct shape {
	uint16_t chroma, wide, out_format, outputs;
};

static uint64_t pack(struct shape s)
{
	return (uint64_t)s.chroma | (uint64_t)s.wide << 16 | (uint64_t)s.out_format << 32 |
	       (uint64_t)s.outputs << 48;
}

static struct shape unpack(uint64_t v)
{
	struct shape s = { (uint16_t)v, (uint16_t)(v >> 16), (uint16_t)(v >> 32), (uint16_t)(v >> 48) };
	return s;
}

static struct hami_slot *my_slot(void)
{
	struct hami_slice_file *f = hami_slice();
	int i = f ? hami_slot() : -1;
	return i >= 0 ? &f->slot[i] : NULL;
}

/* ---- the decoder cap ------------------------------------------------------- */

static int take_one(struct hami_slice_device *d, uint32_t cap)
{
	uint32_t n = __atomic_load_n(&d->decoders, __ATOMIC_ACQUIRE);
	do {
		if (cap && n >= cap)
			return -1;
	} while (!__atomic_compare_exchange_n(&d->decoders, &n, n + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
	return 0;
}

/* Take one of the slice's decoders on a GPU; 0, or -1 when the cap is reached. */
static int take_decoder(int sdev, uint32_t *cap)
{
	struct hami_slice_file *f = hami_slice();
	struct hami_device_limit l;
	*cap = hami_slice_limit(sdev, &l) == 0 ? l.max_decoders : 0;
	if (take_one(&f->device[sdev], *cap) < 0) {
		/* Decoders held by a process that just died come back before we say no. */
		hami_slice_sweep();
		if (take_one(&f->device[sdev], *cap) < 0)
			return -1;
	}
	struct hami_slot *s = my_slot();
	if (s)
		__atomic_add_fetch(&s->decoders[sdev], 1, __ATOMIC_ACQ_REL);
	return 0;
}

static void give_decoder(int sdev)
{
	struct hami_slice_file *f = hami_slice();
	struct hami_slot *s = my_slot();
	if (s && __atomic_load_n(&s->decoders[sdev], __ATOMIC_ACQUIRE) > 0)
		__atomic_sub_fetch(&s->decoders[sdev], 1, __ATOMIC_ACQ_REL);
	uint32_t n = __atomic_load_n(&f->device[sdev].decoders, __ATOMIC_ACQUIRE);
	while (n > 0 && !__atomic_compare_exchange_n(&f->device[sdev].decoders, &n, n - 1, 0,
						     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		;
}

/* The slice GPU a new decoder lands on (the current context's); -1: not governed. */
static int decoder_device(void)
{
	if (!hami_slice() || hami_setup() != CUDA_SUCCESS)
		return -1;
	return hami_current_device(NULL);
}

/* ---- hooks ------------------------------------------------------------------ */

HAMI_EXPORT CUresult cuvidCreateDecoder(CUvideodecoder *decoder, CUVIDDECODECREATEINFO *ci)
{
	HAMI_IN_DRIVER();
	create_fn real = HAMI_REAL(create_fn, "cuvidCreateDecoder");
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	if (!decoder || !ci)
		return real(decoder, ci);
	if (hami_config()->error)
		return CUDA_ERROR_INVALID_VALUE;
	int sdev = decoder_device();
	if (sdev < 0)
		return real(decoder, ci);
	uint32_t cap;
	if (take_decoder(sdev, &cap) < 0) {
		hami_log(HAMI_LOG_ERROR, "slice \"%s\" GPU %s: cuvidCreateDecoder refused: the slice may "
			 "run %u video decoder(s) at once on this GPU and all are in use",
			 hami_slice_name(), hami_slice()->device[sdev].uuid, cap);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	uint64_t bytes = create_bytes(ci);
	CUresult rc = bytes == UINT64_MAX ? CUDA_ERROR_INVALID_VALUE : hami_charge(sdev, bytes, "cuvidCreateDecoder");
	if (rc != CUDA_SUCCESS) {
		give_decoder(sdev);
		return rc;
	}
	rc = real(decoder, ci);
	if (rc != CUDA_SUCCESS) {
		hami_credit(sdev, bytes);
		give_decoder(sdev);
		return rc;
	}
	struct shape shape = { (uint16_t)ci->ChromaFormat, ci->bitDepthMinus8 > 0, (uint16_t)ci->OutputFormat,
			       (uint16_t)(ci->ulNumOutputSurfaces > 1024 ? 1024 : ci->ulNumOutputSurfaces) };
	struct hami_record r = { (uint64_t)(uintptr_t)*decoder, bytes, pack(shape), sdev, HAMI_KIND_DECODER };
	hami_record_put(&r);
	return rc;
}

HAMI_EXPORT CUresult cuvidDestroyDecoder(CUvideodecoder decoder)
{
	HAMI_IN_DRIVER();
	destroy_fn real = HAMI_REAL(destroy_fn, "cuvidDestroyDecoder");
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	struct hami_record r;
	int known = hami_record_take(HAMI_KIND_DECODER, (uint64_t)(uintptr_t)decoder, &r) == 0;
	CUresult rc = real(decoder);
	if (!known)
		return rc;
	if (rc == CUDA_SUCCESS) {
		hami_credit(r.sdev, r.bytes);
		give_decoder(r.sdev);
	} else {
		hami_record_put(&r); /* still alive: still charged */
	}
	return rc;
}

HAMI_EXPORT CUresult cuvidReconfigureDecoder(CUvideodecoder decoder, CUVIDRECONFIGUREDECODERINFO *info)
{
	HAMI_IN_DRIVER();
	reconfigure_fn real = HAMI_REAL(reconfigure_fn, "cuvidReconfigureDecoder");
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	struct hami_record r;
	if (!info || hami_record_get(HAMI_KIND_DECODER, (uint64_t)(uintptr_t)decoder, &r) != 0)
		return real(decoder, info);
	const struct reconfigure_head *h = (const struct reconfigure_head *)info;
	struct shape s = unpack(r.pool);
	uint64_t tw = h->ulTargetWidth ? h->ulTargetWidth : h->ulWidth;
	uint64_t th = h->ulTargetHeight ? h->ulTargetHeight : h->ulHeight;
	uint64_t bytes = decoder_bytes(h->ulWidth, h->ulHeight, h->ulNumDecodeSurfaces, s.chroma, s.wide, tw, th,
				       s.outputs, s.out_format);
	if (bytes == UINT64_MAX)
		return real(decoder, info); /* the driver refuses it */
	/* Growth is charged before the call; shrinking is credited after it. */
	if (bytes > r.bytes) {
		CUresult rc = hami_charge(r.sdev, bytes - r.bytes, "cuvidReconfigureDecoder");
		if (rc != CUDA_SUCCESS)
			return rc;
	}
	CUresult rc = real(decoder, info);
	if (rc != CUDA_SUCCESS) {
		if (bytes > r.bytes)
			hami_credit(r.sdev, bytes - r.bytes);
		return rc;
	}
	if (bytes < r.bytes)
		hami_credit(r.sdev, r.bytes - bytes);
	struct hami_record now;
	if (hami_record_take(HAMI_KIND_DECODER, r.key, &now) == 0) {
		now.bytes = bytes;
		hami_record_put(&now);
	}
	return rc;
}

HAMI_EXPORT CUresult cuvidDecodePicture(CUvideodecoder decoder, CUVIDPICPARAMS *params)
{
	HAMI_IN_DRIVER();
	decode_fn real = HAMI_REAL(decode_fn, "cuvidDecodePicture");
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	if (!hami_slice())
		return real(decoder, params);
	hami_sm_gate_decode();
	uint64_t t0 = hami_monotonic_ns();
	CUresult rc = real(decoder, params);
	struct hami_slot *s = my_slot();
	if (s) {
		__atomic_add_fetch(&s->decode_ns, hami_monotonic_ns() - t0, __ATOMIC_RELAXED);
		if (rc == CUDA_SUCCESS)
			__atomic_add_fetch(&s->frames_decoded, 1, __ATOMIC_RELAXED);
	}
	return rc;
}

static void count_map(CUresult rc)
{
	struct hami_slot *s = rc == CUDA_SUCCESS && hami_slice() ? my_slot() : NULL;
	if (s)
		__atomic_add_fetch(&s->frames_mapped, 1, __ATOMIC_RELAXED);
}

HAMI_EXPORT CUresult cuvidMapVideoFrame64(CUvideodecoder decoder, int pic, unsigned long long *ptr,
					   unsigned int *pitch, CUVIDPROCPARAMS *params)
{
	HAMI_IN_DRIVER();
	map64_fn real = HAMI_REAL(map64_fn, "cuvidMapVideoFrame64");
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = real(decoder, pic, ptr, pitch, params);
	count_map(rc);
	return rc;
}

HAMI_EXPORT CUresult cuvidMapVideoFrame(CUvideodecoder decoder, int pic, unsigned int *ptr, unsigned int *pitch,
					 CUVIDPROCPARAMS *params)
{
	HAMI_IN_DRIVER();
	map32_fn real = HAMI_REAL(map32_fn, "cuvidMapVideoFrame");
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = real(decoder, pic, ptr, pitch, params);
	count_map(rc);
	return rc;
}

/* Unmapping frees nothing of the slice's (output surfaces are charged at
 * create); hooked so that every entry point of a map/unmap pair is ours. */
HAMI_EXPORT CUresult cuvidUnmapVideoFrame64(CUvideodecoder decoder, unsigned long long ptr)
{
	HAMI_IN_DRIVER();
	unmap64_fn real = HAMI_REAL(unmap64_fn, "cuvidUnmapVideoFrame64");
	return real ? real(decoder, ptr) : CUDA_ERROR_NOT_FOUND;
}

HAMI_EXPORT CUresult cuvidUnmapVideoFrame(CUvideodecoder decoder, unsigned int ptr)
{
	HAMI_IN_DRIVER();
	unmap32_fn real = HAMI_REAL(unmap32_fn, "cuvidUnmapVideoFrame");
	return real ? real(decoder, ptr) : CUDA_ERROR_NOT_FOUND;
}

/* Capabilities are the GPU's, not the slice's: passed through, hooked so a
 * caller that resolves every entry point through us gets the same answer. */
HAMI_EXPORT CUresult cuvidGetDecoderCaps(CUVIDDECODECAPS *caps)
{
	caps_fn real = HAMI_REAL(caps_fn, "cuvidGetDecoderCaps");
	return real ? real(caps) : CUDA_ERROR_NOT_FOUND;
}

/* A parser holds no GPU memory; its callbacks create decoders through
 * cuvidCreateDecoder, which is charged above. */
HAMI_EXPORT CUresult cuvidCreateVideoParser(CUvideoparser *parser, CUVIDPARSERPARAMS *params)
{
	parser_create_fn real = HAMI_REAL(parser_create_fn, "cuvidCreateVideoParser");
	return real ? real(parser, params) : CUDA_ERROR_NOT_FOUND;
}

HAMI_EXPORT CUresult cuvidDestroyVideoParser(CUvideoparser parser)
{
	parser_destroy_fn real = HAMI_REAL(parser_destroy_fn, "cuvidDestroyVideoParser");
	return real ? real(parser) : CUDA_ERROR_NOT_FOUND;
}
