/*
 * libnvcuvid.so.1 of the simulated GPU: NVDEC's decoder API with the real
 * ABI (cuviddec.h / nvcuvid.h of the Video Codec SDK), no video anywhere.
 *
 * What matters is what a decoder costs the shared device: the real driver
 * allocates a decoder's surfaces itself, out of sight of any cuMemAlloc hook,
 * so this library charges its own estimate (README.md, "NVDEC") straight to
 * sim_state, the same counter cuMemAlloc charges, and to this process's entry:
 * a killed process's decoders come back with the rest of its memory. It never
 * calls the exported cuMemAlloc, which the preload library would charge a
 * second time.
 *
 * A decoder belongs to the device of the CUDA context current on the calling
 * thread at cuvidCreateDecoder; that context is asked of libcuda.so.1 itself
 * (dlopen + dlsym of cuCtxGetCurrent, cuCtxGetDevice and cuDeviceGetUuid,
 * which the preload does not hook), and the CUDA device is matched to the
 * simulated one by UUID, so CUDA_VISIBLE_DEVICES renumbering is followed.
 *
 * Decoders, parsers and context locks live in a fixed table; a handle encodes
 * kind, slot and generation, so a stale or foreign handle is refused
 * (CUDA_ERROR_INVALID_HANDLE), never dereferenced. One mutex guards it all.
 * Only the cuvid* entry points below leave the library.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hami/cuvid_types.h"
#include "sim_state.h"

#define EXPORT __attribute__((visibility("default")))

/* The simulated NVDEC (what cuvidGetDecoderCaps answers). */
#define NVDEC_ENGINES 7
#define MAX_DIM 8192u
#define MIN_WIDTH 48u
#define MIN_HEIGHT 16u
#define MAX_SURFACES 64u

/* The memory estimate: pitch and row alignment of a surface. */
#define PITCH_ALIGN 256ull
#define ROW_ALIGN 32ull

/* Objects (decoders, parsers and locks together) one process may hold. */
#define MAX_OBJECTS 4096u

/* Fake frame addresses: 64-bit maps get VA64_BASE + (slot << 40) + output
 * surface * (its size rounded to MAP_ALIGN), 32-bit maps VA32_BASE + (slot
 * << 18) + (output surface << 12). Neither range is memory sim copies accept. */
#define VA64_BASE 0x5000000000000000ull
#define MAP_ALIGN (2ull << 20)
#define VA32_BASE 0x40000000u

/* Handles: tag << 48 | kind << 44 | generation << 12 | slot. */
#define HANDLE_TAG 0x5ec0ull

enum { cudaVideoDecodeStatus_Success = 2 };

enum okind { O_NONE, O_DECODER, O_PARSER, O_LOCK };

struct decoder {
	unsigned dev;    /* simulated (physical) device charged */
	uint64_t bytes;  /* charged now */
	int codec, chroma, out_format;
	unsigned depth_minus8;
	unsigned width, height, max_width, max_height, target_width, target_height;
	unsigned surfaces, outputs;
	uint64_t frames, maps;
	unsigned mapped;
	uint64_t map_ptr[MAX_SURFACES]; /* per output surface: its mapped address, 0 when free */
};

struct ctxlock {
	CUcontext ctx;
	pthread_mutex_t mu; /* error-checking: relocking or a stranger's unlock is refused */
};

struct slot {
	uint32_t gen;
	enum okind kind;
	void *p;
};

typedef CUresult (*fn_ctx_get_current)(CUcontext *);
typedef CUresult (*fn_ctx_get_device)(CUdevice *);
typedef CUresult (*fn_device_uuid)(CUuuid *, CUdevice);
typedef CUresult (*fn_ctx_push)(CUcontext);
typedef CUresult (*fn_ctx_pop)(CUcontext *);

static struct {
	pthread_mutex_t mu;
	struct slot slot[MAX_OBJECTS];
	uint32_t gen;
	int sim_rc; /* sim_open's result */
	void *cuda;
	fn_ctx_get_current get_current;
	fn_ctx_get_device get_device;
	fn_device_uuid get_uuid;
	fn_ctx_push push;
	fn_ctx_pop pop;
} V = {.mu = PTHREAD_MUTEX_INITIALIZER, .sim_rc = SIM_EIO};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* ---- process-wide setup ---------------------------------------------------- */

static void free_object(struct slot *s)
{
	if (s->kind == O_LOCK && s->p)
		pthread_mutex_destroy(&((struct ctxlock *)s->p)->mu);
	free(s->p);
	s->p = NULL;
	s->kind = O_NONE;
}

static void fork_prepare(void)
{
	pthread_mutex_lock(&V.mu);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&V.mu);
}

/* A forked child inherits its parent's objects, whose memory the parent's
 * entry holds: it starts with none (its handles are refused). */
static void fork_child(void)
{
	for (unsigned i = 0; i < MAX_OBJECTS; i++) {
		if (V.slot[i].kind != O_NONE) {
			V.slot[i].gen++;
			free_object(&V.slot[i]);
		}
	}
	pthread_mutex_unlock(&V.mu);
}

static void *cuda_sym(const char *name)
{
	return V.cuda ? dlsym(V.cuda, name) : NULL;
}

static void lib_init(void)
{
	/* sim_state's fork handlers first, so that fork takes V.mu before its lock. */
	sim_atfork_init();
	pthread_atfork(fork_prepare, fork_parent, fork_child);
	V.cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	V.get_current = (fn_ctx_get_current)cuda_sym("cuCtxGetCurrent");
	V.get_device = (fn_ctx_get_device)cuda_sym("cuCtxGetDevice");
	V.get_uuid = (fn_device_uuid)cuda_sym("cuDeviceGetUuid_v2");
	if (!V.get_uuid)
		V.get_uuid = (fn_device_uuid)cuda_sym("cuDeviceGetUuid");
	V.push = (fn_ctx_push)cuda_sym("cuCtxPushCurrent_v2");
	V.pop = (fn_ctx_pop)cuda_sym("cuCtxPopCurrent_v2");
	V.sim_rc = sim_open(NULL);
}

static void init(void)
{
	pthread_once(&init_once, lib_init);
}

/* The simulated device of the calling thread's current context. */
static CUresult current_device(unsigned *phys)
{
	CUcontext ctx = NULL;
	CUdevice dev = -1;
	if (!V.get_current || !V.get_device || V.get_current(&ctx) != CUDA_SUCCESS || !ctx ||
	    V.get_device(&dev) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (V.sim_rc != SIM_OK)
		return CUDA_ERROR_OPERATING_SYSTEM;
	struct sim_state *st = sim_st();
	CUuuid u;
	if (!V.get_uuid || V.get_uuid(&u, dev) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_DEVICE;
	const unsigned char *b = (const unsigned char *)u.bytes;
	char text[SIM_UUID_LEN];
	snprintf(text, sizeof(text), "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
		 b[15]);
	for (unsigned i = 0; i < st->hdr.ndev && i < SIM_MAX_DEVICES; i++) {
		if (strcasecmp(st->dev[i].uuid, text) == 0) {
			*phys = i;
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_INVALID_DEVICE; /* not a device of the simulated GPU */
}

/* ---- handles ------------------------------------------------------------------ */

static uint64_t handle_of(unsigned i)
{
	return HANDLE_TAG << 48 | (uint64_t)V.slot[i].kind << 44 | (uint64_t)V.slot[i].gen << 12 | i;
}

/* The live slot handle H names if it is of kind K, or NULL. Under V.mu. */
static struct slot *find(const void *h, enum okind k)
{
	uint64_t v = (uint64_t)(uintptr_t)h;
	unsigned i = (unsigned)(v & 0xfff);
	if (v >> 48 != HANDLE_TAG || ((v >> 44) & 0xf) != (uint64_t)k || i >= MAX_OBJECTS)
		return NULL;
	struct slot *s = &V.slot[i];
	if (s->kind != k || s->gen != (uint32_t)(v >> 12))
		return NULL;
	return s;
}

/* The object behind handle H of kind K, or NULL. Under V.mu. */
static void *lookup(const void *h, enum okind k)
{
	struct slot *s = find(h, k);
	return s ? s->p : NULL;
}

static unsigned slot_index(const void *h)
{
	return (unsigned)((uint64_t)(uintptr_t)h & 0xfff);
}

/* A free slot for P of kind K: its index, or -1 when the table is full. Under V.mu. */
static int slot_take(enum okind k, void *p)
{
	for (unsigned i = 0; i < MAX_OBJECTS; i++) {
		struct slot *s = &V.slot[i];
		if (s->kind == O_NONE) {
			s->kind = k;
			s->gen = ++V.gen;
			s->p = p;
			return (int)i;
		}
	}
	return -1;
}

static void slot_release(unsigned i)
{
	V.slot[i].gen++; /* the old handle is stale from now on */
	V.slot[i].p = NULL;
	V.slot[i].kind = O_NONE;
}

/* ---- what the simulated NVDEC supports ----------------------------------------- */

static int codec_supported(int codec, int chroma, unsigned long depth_minus8)
{
	switch (codec) {
	case cudaVideoCodec_MPEG2:
	case cudaVideoCodec_H264:
	case cudaVideoCodec_HEVC:
	case cudaVideoCodec_AV1:
		break;
	default:
		return 0;
	}
	return chroma == cudaVideoChromaFormat_420 && (depth_minus8 == 0 || depth_minus8 == 2);
}

/* Output formats: NV12 always; P016 too when decoding 10-bit. */
static unsigned format_mask(unsigned long depth_minus8)
{
	unsigned m = 1u << cudaVideoSurfaceFormat_NV12;
	if (depth_minus8 > 0)
		m |= 1u << cudaVideoSurfaceFormat_P016;
	return m;
}

/* ---- the memory estimate ---------------------------------------------------------- */

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* Chroma planes as halves of the luma plane: 4:0:0 2/2, 4:2:0 3/2, 4:2:2 4/2, 4:4:4 6/2. */
static uint64_t chroma_halves(int chroma)
{
	switch (chroma) {
	case cudaVideoChromaFormat_Monochrome:
		return 2;
	case cudaVideoChromaFormat_422:
		return 4;
	case cudaVideoChromaFormat_444:
		return 6;
	default:
		return 3;
	}
}

/* One surface: rows of align256(width * bytes per sample), align32(height) of them. */
static uint64_t surface_bytes(uint64_t w, uint64_t h, int chroma, unsigned sample_bytes)
{
	return align_up(w * sample_bytes, PITCH_ALIGN) * align_up(h, ROW_ALIGN) * chroma_halves(chroma) / 2;
}

static int format_chroma(int format)
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

static unsigned format_sample_bytes(int format)
{
	return format == cudaVideoSurfaceFormat_P016 || format == cudaVideoSurfaceFormat_YUV444_16Bit ||
			       format == cudaVideoSurfaceFormat_P216
		       ? 2
		       : 1;
}

static uint64_t output_surface_bytes(const struct decoder *d)
{
	return surface_bytes(d->target_width, d->target_height, format_chroma(d->out_format),
			     format_sample_bytes(d->out_format));
}

/* Decode surfaces at the current coded size, output surfaces at the target size. */
static uint64_t decoder_bytes(const struct decoder *d)
{
	return d->surfaces * surface_bytes(d->width, d->height, d->chroma, d->depth_minus8 ? 2 : 1) +
	       d->outputs * output_surface_bytes(d);
}

static CUresult charge(unsigned dev, uint64_t bytes)
{
	int r = sim_charge(dev, bytes);
	return r == SIM_OK ? CUDA_SUCCESS : r == SIM_ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_OPERATING_SYSTEM;
}

/* ---- capabilities ------------------------------------------------------------------- */

EXPORT CUresult cuvidGetDecoderCaps(CUVIDDECODECAPS *pdc)
{
	if (!pdc)
		return CUDA_ERROR_INVALID_VALUE;
	init();
	unsigned dev;
	CUresult r = current_device(&dev);
	if (r)
		return r;
	int ok = codec_supported(pdc->eCodecType, pdc->eChromaFormat, pdc->nBitDepthMinus8);
	pdc->bIsSupported = ok ? 1 : 0;
	pdc->nNumNVDECs = NVDEC_ENGINES;
	pdc->nOutputFormatMask = ok ? (unsigned short)format_mask(pdc->nBitDepthMinus8) : 0;
	pdc->nMaxWidth = ok ? MAX_DIM : 0;
	pdc->nMaxHeight = ok ? MAX_DIM : 0;
	pdc->nMaxMBCount = ok ? (MAX_DIM / 16) * (MAX_DIM / 16) : 0;
	pdc->nMinWidth = ok ? MIN_WIDTH : 0;
	pdc->nMinHeight = ok ? MIN_HEIGHT : 0;
	pdc->bIsHistogramSupported = 0;
	pdc->nCounterBitDepth = 0;
	pdc->nMaxHistogramBins = 0;
	return CUDA_SUCCESS;
}

/* ---- decoders ----------------------------------------------------------------------- */

EXPORT CUresult cuvidCreateDecoder(CUvideodecoder *phDecoder, CUVIDDECODECREATEINFO *ci)
{
	if (!phDecoder || !ci)
		return CUDA_ERROR_INVALID_VALUE;
	init();
	unsigned dev;
	CUresult r = current_device(&dev);
	if (r)
		return r;
	if (!ci->ulWidth || !ci->ulHeight || ci->ulNumDecodeSurfaces < 1 || ci->ulNumDecodeSurfaces > MAX_SURFACES ||
	    ci->ulNumOutputSurfaces < 1 || ci->ulNumOutputSurfaces > MAX_SURFACES)
		return CUDA_ERROR_INVALID_VALUE;
	if ((ci->ulMaxWidth && ci->ulMaxWidth < ci->ulWidth) || (ci->ulMaxHeight && ci->ulMaxHeight < ci->ulHeight))
		return CUDA_ERROR_INVALID_VALUE;
	unsigned long max_w = ci->ulMaxWidth ? ci->ulMaxWidth : ci->ulWidth;
	unsigned long max_h = ci->ulMaxHeight ? ci->ulMaxHeight : ci->ulHeight;
	unsigned long tw = ci->ulTargetWidth ? ci->ulTargetWidth : ci->ulWidth;
	unsigned long th = ci->ulTargetHeight ? ci->ulTargetHeight : ci->ulHeight;
	if (!codec_supported(ci->CodecType, ci->ChromaFormat, ci->bitDepthMinus8) || ci->ulWidth < MIN_WIDTH ||
	    ci->ulHeight < MIN_HEIGHT || max_w > MAX_DIM || max_h > MAX_DIM || tw > MAX_DIM || th > MAX_DIM ||
	    ci->OutputFormat < 0 || ci->OutputFormat > 15 || !(format_mask(ci->bitDepthMinus8) & (1u << ci->OutputFormat)))
		return CUDA_ERROR_NOT_SUPPORTED;

	struct decoder *d = calloc(1, sizeof(*d));
	if (!d)
		return CUDA_ERROR_OUT_OF_MEMORY;
	d->dev = dev;
	d->codec = ci->CodecType;
	d->chroma = ci->ChromaFormat;
	d->depth_minus8 = (unsigned)ci->bitDepthMinus8;
	d->out_format = ci->OutputFormat;
	d->width = (unsigned)ci->ulWidth;
	d->height = (unsigned)ci->ulHeight;
	d->max_width = (unsigned)max_w;
	d->max_height = (unsigned)max_h;
	d->target_width = (unsigned)tw;
	d->target_height = (unsigned)th;
	d->surfaces = (unsigned)ci->ulNumDecodeSurfaces;
	d->outputs = (unsigned)ci->ulNumOutputSurfaces;
	uint64_t bytes = decoder_bytes(d);

	pthread_mutex_lock(&V.mu);
	int i = slot_take(O_DECODER, d);
	if (i < 0) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else if ((r = charge(dev, bytes)) != CUDA_SUCCESS) {
		slot_release((unsigned)i);
	} else {
		d->bytes = bytes;
		sim_decoder_count(dev, 1);
		*phDecoder = (CUvideodecoder)(uintptr_t)handle_of((unsigned)i);
	}
	pthread_mutex_unlock(&V.mu);
	if (r)
		free(d);
	return r;
}

EXPORT CUresult cuvidDestroyDecoder(CUvideodecoder hDecoder)
{
	init();
	pthread_mutex_lock(&V.mu);
	struct decoder *d = lookup(hDecoder, O_DECODER);
	if (d) {
		sim_uncharge(d->dev, d->bytes);
		sim_decoder_count(d->dev, -1);
		slot_release(slot_index(hDecoder));
	}
	pthread_mutex_unlock(&V.mu);
	if (!d)
		return CUDA_ERROR_INVALID_HANDLE;
	free(d);
	return CUDA_SUCCESS;
}

/* The head of CUVIDRECONFIGUREDECODERINFO: the only fields read. */
struct reconfigure_head {
	unsigned int ulWidth;
	unsigned int ulHeight;
	unsigned int ulTargetWidth;
	unsigned int ulTargetHeight;
	unsigned int ulNumDecodeSurfaces;
};

EXPORT CUresult cuvidReconfigureDecoder(CUvideodecoder hDecoder, CUVIDRECONFIGUREDECODERINFO *info)
{
	init();
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&V.mu);
	struct decoder *d = lookup(hDecoder, O_DECODER);
	if (!d) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	if (!info) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	struct reconfigure_head h;
	memcpy(&h, info, sizeof(h));
	if (!h.ulWidth || !h.ulHeight || h.ulNumDecodeSurfaces < 1 || h.ulNumDecodeSurfaces > MAX_SURFACES ||
	    h.ulWidth > d->max_width || h.ulHeight > d->max_height) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	struct decoder n = *d;
	n.width = h.ulWidth;
	n.height = h.ulHeight;
	n.target_width = h.ulTargetWidth ? h.ulTargetWidth : h.ulWidth;
	n.target_height = h.ulTargetHeight ? h.ulTargetHeight : h.ulHeight;
	n.surfaces = h.ulNumDecodeSurfaces;
	if (n.width < MIN_WIDTH || n.height < MIN_HEIGHT || n.target_width > MAX_DIM || n.target_height > MAX_DIM) {
		r = CUDA_ERROR_NOT_SUPPORTED;
		goto out;
	}
	uint64_t bytes = decoder_bytes(&n);
	if (bytes > d->bytes)
		r = charge(d->dev, bytes - d->bytes);
	else
		sim_uncharge(d->dev, d->bytes - bytes);
	if (r == CUDA_SUCCESS) {
		n.bytes = bytes;
		*d = n;
	}
out:
	pthread_mutex_unlock(&V.mu);
	return r;
}

EXPORT CUresult cuvidDecodePicture(CUvideodecoder hDecoder, CUVIDPICPARAMS *pPicParams)
{
	init();
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&V.mu);
	struct decoder *d = lookup(hDecoder, O_DECODER);
	if (!d) {
		r = CUDA_ERROR_INVALID_HANDLE;
	} else if (!pPicParams) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		d->frames++;
		atomic_fetch_add(&sim_st()->dev[d->dev].frames_decoded, 1);
	}
	pthread_mutex_unlock(&V.mu);
	return r;
}

EXPORT CUresult cuvidGetDecodeStatus(CUvideodecoder hDecoder, int nPicIdx, void *pDecodeStatus)
{
	init();
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&V.mu);
	struct decoder *d = lookup(hDecoder, O_DECODER);
	if (!d) {
		r = CUDA_ERROR_INVALID_HANDLE;
	} else if (!pDecodeStatus || nPicIdx < 0 || (unsigned)nPicIdx >= d->surfaces) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		int status = cudaVideoDecodeStatus_Success; /* decodeStatus, the struct's first field */
		memcpy(pDecodeStatus, &status, sizeof(status));
	}
	pthread_mutex_unlock(&V.mu);
	return r;
}

/* Map picture PIC into a free output surface; *PTR its fake address (WIDE: 64-bit). */
static CUresult map_frame(CUvideodecoder hDecoder, int pic, uint64_t *ptr, unsigned *pitch, int wide)
{
	init();
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&V.mu);
	struct decoder *d = lookup(hDecoder, O_DECODER);
	unsigned out = 0;
	if (!d) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto done;
	}
	if (pic < 0 || (unsigned)pic >= d->surfaces) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto done;
	}
	while (out < d->outputs && d->map_ptr[out])
		out++;
	if (out == d->outputs) { /* all ulNumOutputSurfaces are mapped */
		r = CUDA_ERROR_INVALID_VALUE;
		goto done;
	}
	unsigned i = slot_index(hDecoder);
	uint64_t p = wide ? VA64_BASE + ((uint64_t)i << 40) + out * align_up(output_surface_bytes(d), MAP_ALIGN)
			  : VA32_BASE + ((uint64_t)i << 18) + ((uint64_t)out << 12);
	d->map_ptr[out] = p;
	d->mapped++;
	d->maps++;
	atomic_fetch_add(&sim_st()->dev[d->dev].frames_mapped, 1);
	*ptr = p;
	*pitch = (unsigned)align_up((uint64_t)d->target_width * format_sample_bytes(d->out_format), PITCH_ALIGN);
done:
	pthread_mutex_unlock(&V.mu);
	return r;
}

EXPORT CUresult cuvidMapVideoFrame64(CUvideodecoder hDecoder, int nPicIdx, unsigned long long *pDevPtr,
				     unsigned int *pPitch, CUVIDPROCPARAMS *pVPP)
{
	if (!pDevPtr || !pPitch)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t p;
	unsigned pitch;
	CUresult r = map_frame(hDecoder, nPicIdx, &p, &pitch, 1);
	if (r == CUDA_SUCCESS) {
		*pDevPtr = p;
		*pPitch = pitch;
	}
	return r;
}

EXPORT CUresult cuvidMapVideoFrame(CUvideodecoder hDecoder, int nPicIdx, unsigned int *pDevPtr, unsigned int *pPitch,
				   CUVIDPROCPARAMS *pVPP)
{
	if (!pDevPtr || !pPitch)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t p;
	unsigned pitch;
	CUresult r = map_frame(hDecoder, nPicIdx, &p, &pitch, 0);
	if (r == CUDA_SUCCESS) {
		*pDevPtr = (unsigned int)p;
		*pPitch = pitch;
	}
	return r;
}

static CUresult unmap_frame(CUvideodecoder hDecoder, uint64_t p)
{
	init();
	CUresult r = CUDA_ERROR_INVALID_VALUE; /* not a mapped frame of this decoder */
	pthread_mutex_lock(&V.mu);
	struct decoder *d = lookup(hDecoder, O_DECODER);
	if (!d) {
		r = CUDA_ERROR_INVALID_HANDLE;
	} else if (p) {
		for (unsigned out = 0; out < d->outputs; out++) {
			if (d->map_ptr[out] == p) {
				d->map_ptr[out] = 0;
				d->mapped--;
				r = CUDA_SUCCESS;
				break;
			}
		}
	}
	pthread_mutex_unlock(&V.mu);
	return r;
}

EXPORT CUresult cuvidUnmapVideoFrame64(CUvideodecoder hDecoder, unsigned long long DevPtr)
{
	return unmap_frame(hDecoder, DevPtr);
}

EXPORT CUresult cuvidUnmapVideoFrame(CUvideodecoder hDecoder, unsigned int DevPtr)
{
	return unmap_frame(hDecoder, DevPtr);
}

/* ---- parsers: opaque objects (no bitstream is ever parsed) ----------------------------- */

EXPORT CUresult cuvidCreateVideoParser(CUvideoparser *pObj, CUVIDPARSERPARAMS *pParams)
{
	if (!pObj || !pParams)
		return CUDA_ERROR_INVALID_VALUE;
	init();
	pthread_mutex_lock(&V.mu);
	int i = slot_take(O_PARSER, NULL);
	if (i >= 0)
		*pObj = (CUvideoparser)(uintptr_t)handle_of((unsigned)i);
	pthread_mutex_unlock(&V.mu);
	return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuvidDestroyVideoParser(CUvideoparser obj)
{
	init();
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&V.mu);
	if (find(obj, O_PARSER)) /* a parser's slot holds no object */
		slot_release(slot_index(obj));
	else
		r = CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_unlock(&V.mu);
	return r;
}

/* ---- context locks: a mutex that makes its context current while held ------------------ */

EXPORT CUresult cuvidCtxLockCreate(CUvideoctxlock *pLock, CUcontext ctx)
{
	if (!pLock)
		return CUDA_ERROR_INVALID_VALUE;
	init();
	struct ctxlock *l = calloc(1, sizeof(*l));
	if (!l)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK);
	pthread_mutex_init(&l->mu, &a);
	pthread_mutexattr_destroy(&a);
	l->ctx = ctx;
	pthread_mutex_lock(&V.mu);
	int i = slot_take(O_LOCK, l);
	if (i >= 0)
		*pLock = (CUvideoctxlock)(uintptr_t)handle_of((unsigned)i);
	pthread_mutex_unlock(&V.mu);
	if (i < 0) {
		pthread_mutex_destroy(&l->mu);
		free(l);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuvidCtxLockDestroy(CUvideoctxlock lck)
{
	init();
	pthread_mutex_lock(&V.mu);
	struct ctxlock *l = lookup(lck, O_LOCK);
	if (l) {
		/* Still held by someone: refused rather than pulled from under them. */
		if (pthread_mutex_trylock(&l->mu) != 0) {
			pthread_mutex_unlock(&V.mu);
			return CUDA_ERROR_NOT_PERMITTED;
		}
		pthread_mutex_unlock(&l->mu);
		slot_release(slot_index(lck));
	}
	pthread_mutex_unlock(&V.mu);
	if (!l)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_destroy(&l->mu);
	free(l);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuvidCtxLock(CUvideoctxlock lck, unsigned int reserved_flags)
{
	init();
	pthread_mutex_lock(&V.mu);
	struct ctxlock *l = lookup(lck, O_LOCK);
	pthread_mutex_unlock(&V.mu);
	if (!l)
		return CUDA_ERROR_INVALID_HANDLE;
	if (pthread_mutex_lock(&l->mu) != 0)
		return CUDA_ERROR_INVALID_VALUE; /* this thread holds it already */
	CUresult r = V.push ? V.push(l->ctx) : CUDA_ERROR_NOT_INITIALIZED;
	if (r)
		pthread_mutex_unlock(&l->mu);
	return r;
}

EXPORT CUresult cuvidCtxUnlock(CUvideoctxlock lck, unsigned int reserved_flags)
{
	init();
	pthread_mutex_lock(&V.mu);
	struct ctxlock *l = lookup(lck, O_LOCK);
	pthread_mutex_unlock(&V.mu);
	if (!l)
		return CUDA_ERROR_INVALID_HANDLE;
	if (pthread_mutex_unlock(&l->mu) != 0)
		return CUDA_ERROR_INVALID_VALUE; /* not held by this thread */
	/* The context stack is the thread's own: popping after the unlock is safe. */
	return V.pop ? V.pop(NULL) : CUDA_ERROR_NOT_INITIALIZED;
}
