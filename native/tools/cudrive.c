/*
 * cudrive: a CUDA driver API command runner for tests and benchmarks.
 *
 * It never links libcuda: it dlopen()s "libcuda.so.1" (and "libnvidia-ml.so.1"
 * for the nvml commands) and resolves every entry point either with dlsym (the
 * default), or through cuGetProcAddress_v2 / cuGetProcAddress after
 * `resolve procaddr` / `resolve procaddr1`. The same script therefore runs
 * against the real driver, the simulated GPU, with or without the preload
 * library, and through both of its interception paths.
 *
 *   cudrive init ctx 0 alloc 256m x meminfo free x
 *   cudrive stdin            (then one command per line on standard input)
 *
 * Each executed command prints exactly one JSON object line and flushes:
 *   {"op":"alloc","pid":123,"rc":2,"err":"CUDA_ERROR_OUT_OF_MEMORY",...}
 * rc is the CUresult (nvmlReturn_t for nvml commands); -1 marks a cudrive
 * usage error (err "CUDRIVE_..."). cudrive reports failures and goes on; it
 * exits 0 unless told `exit N`.
 *
 * Optional trailing NAME arguments are taken when the next word is not a
 * command word; in stdin mode a command and its arguments stay on one line
 * (a "#" word starts a comment to the end of the line).
 *
 * Commands (SIZE: bytes or k/m/g/t with binary units; NAME optional):
 *   init | count | ctx DEV | ctxrelease DEV | ctxcreate DEV [NAME] | ctxdestroy NAME
 *   alloc SIZE [NAME] | pitch WIDTH HEIGHT ELEMBYTES [NAME] | managed SIZE [NAME]
 *   async SIZE [NAME] | pool DEV [NAME] | poolalloc POOL SIZE [NAME]
 *   poolattr POOL | pooltrim POOL BYTES | pooldestroy POOL   (POOL may be "default")
 *   memcreate SIZE DEV|host [NAME] | array W H FMT CH [NAME]
 *   array3d W H D FMT CH [NAME] | mipmap W H D FMT CH LEVELS [NAME]
 *   free NAME | freeraw PTR | freeall | list
 *   freeasync NAME              cuMemFreeAsync of any memory object (alloc, async...)
 *   write NAME BYTE             fill the allocation NAME with BYTE (cuMemcpyHtoD_v2)
 *   check NAME BYTE             read NAME back (cuMemcpyDtoH_v2): equal (every byte is BYTE),
 *                               mismatches, and the first one's offset (first_mismatch, -1
 *                               when none) and value (found)
 *   meminfo | totalmem DEV | uuid DEV | sync
 *   fill SIZE | race ITERATIONS MAXSIZE SEED [SECONDS] | threads N ITERATIONS MAXSIZE SEED | null WHAT
 *                               (race stops after SECONDS too: a sanitizer build is many
 *                               times slower, a test that needs the race to last wants time)
 *   churn SIZE SECONDS          allocate SIZE and free it again, over and over, as a loop that
 *                               makes one tensor a step does: loops, ok, oom, other, elapsed_ns
 *   getproc BASENAME VERSION FLAGS | getproc1 BASENAME VERSION FLAGS
 *   dlsym NAME | nvmldlsym NAME | resolve dlsym|next|default|procaddr|procaddr1 [VERSION [FLAGS]]
 *                               (next, default: dlsym(RTLD_NEXT / RTLD_DEFAULT, ...) from cudrive)
 *   nvml | nvmlcount | nvmlmem IDX | nvmluuid IDX | nvmlshutdown
 *   nvmlprocs IDX [1|2|3]       nvmlDeviceGetComputeRunningProcesses (_v2, _v3; default 3):
 *                               processes [{pid, used}], count, version
 *   nvmlgraphics IDX [1|2|3]    the same of nvmlDeviceGetGraphicsRunningProcesses
 *   sleep MS | echo [WORD] | waitfile PATH [TIMEOUT_MS] | hold | exit [N] | stdin
 *   handle INT|USR1|CHLD        a do-nothing handler (no SA_RESTART), as Python installs one
 *   child ... endchild          the commands in between in a fork()ed child; then
 *                               {"op":"child","child":PID,"status":N,"signal":N}
 *   worker NAME ... endworker   the commands in between on cudrive's worker thread NAME, made
 *                               at its first block with the caller's current context; it keeps
 *                               its context, capture mode and captures between blocks. The caller
 *                               waits for the block, then prints {"op":"worker","name":..,"blocks":N}
 *
 * Virtual memory (the driver's rules; the fast park stands on them):
 *   vmalloc SIZE DEV [NAME]     memory a program maps itself, as PyTorch's expandable segments do:
 *                               cuMemCreate, cuMemAddressReserve, cuMemMap, cuMemSetAccess (rw for
 *                               DEV), SIZE rounded up to the granularity; `free NAME` undoes it all
 *   vm reserve NAME SIZE [ALIGN [ADDR]] | vm map RANGE OFFSET HANDLE [SIZE [HANDLE_OFFSET]] |
 *   vm unmap RANGE OFFSET SIZE | vm access RANGE OFFSET SIZE DEV none|r|rw |
 *   vm getaccess RANGE OFFSET DEV | vm retain RANGE OFFSET [NAME] | vm gran DEV
 *                               the calls one by one (a HANDLE is memcreate's; `free RANGE` is
 *                               cuMemAddressFree); write, check and touch take a range whole
 *   touch NAME [COUNT [PAUSE_MS]]
 *                               COUNT kernels adding 1 to every byte of NAME (the simulated GPU's
 *                               "hami_sim_touch"; a PTX kernel of that name on a real GPU),
 *                               PAUSE_MS apart
 *   range NAME [OFFSET] | ptrattr NAME [OFFSET] | ipc NAME | peer DEV
 *                               cuMemGetAddressRange_v2 (base_offset from NAME's start, size);
 *                               cuPointerGetAttributes (context, type, ordinal, ipc, start_offset,
 *                               size, mapped, managed, buffer_id); cuIpcGetMemHandle of NAME;
 *                               cuCtxEnablePeerAccess to DEV's primary context
 *   simfail CALL N              the simulated GPU's hamiSimFail: the Nth next call of CALL fails
 *
 * Process checkpoints (another process's GPU memory to host memory and back):
 *   ckpt lock PID [TIMEOUT_MS]  cuCheckpointProcessLock (no TIMEOUT_MS: NULL args, no timeout);
 *                               waited_ms: how long the call took
 *   ckpt checkpoint PID | ckpt restore PID | ckpt unlock PID
 *                               cuCheckpointProcessCheckpoint / Restore / Unlock (NULL args)
 *   ckpt state PID              cuCheckpointProcessGetState: state (CUprocessState) and its name
 *
 * Kernels (NS: kernel duration in ns; COUNT defaults to 1):
 *   module [KERNEL]             (re)load the busy kernel "hami_sim_busy" in the current context
 *                               (KERNEL: a kernel of that name instead, which launch & co. run)
 *   launch NS [COUNT] | launchex NS [COUNT] | coop NS [COUNT]
 *                               cuLaunchKernel / cuLaunchKernelEx / cuLaunchCooperativeKernel on
 *                               the NULL stream, or on the capture stream while capturing
 *   capture begin [global|thread|relaxed] | capture end [NAME] | capture status
 *                               stream capture on cudrive's own (non-blocking) stream (status:
 *                               CUstreamCaptureStatus, 0 none, 1 active, 2 invalidated); an end
 *                               answered CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD leaves it going
 *   capture info                cuStreamGetCaptureInfo_v2 (dlsym): status, id, graph, dependencies
 *   capturemode global|thread|relaxed
 *                               cuThreadExchangeStreamCaptureMode for the calling thread: mode,
 *                               previous
 *   graph NAME [autofree] | graphlaunch NAME [COUNT]
 *                               instantiate a captured graph (again: the old executable is
 *                               destroyed first; autofree: CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_
 *                               ON_LAUNCH) / launch it on the capture stream
 *   ungraph NAME | graphupload NAME
 *                               cuGraphExecDestroy of its executable / cuGraphUpload of it
 *   graphmem DEV                cuDeviceGetGraphMemAttribute: used, used_high, reserved,
 *                               reserved_high
 *   graphmemreset DEV | graphtrim DEV
 *                               cuDeviceSetGraphMemAttribute (both high marks := 0) /
 *                               cuDeviceGraphMemTrim
 * While a capture is under way, async, poolalloc, freeasync and the free of
 * async/poolalloc memory go to the capture stream (their records say
 * "stream":"capture"): graph allocation and free nodes. Other commands call
 * what they always call (alloc, free of alloc memory, sync, meminfo, poolattr
 * are capture-unsafe calls).
 *
 * The simulated GPU's own knobs (dlsym in libcuda.so.1; CUDA_ERROR_NOT_FOUND
 * on a real driver), after init:
 *   internal DEV SIZE           hamiSimDriverInternal: this process's driver-internal bytes on
 *                               CUDA device DEV become SIZE (0 gives them back)
 *   graphics [0|1]              hamiSimGraphicsProcess: NVML lists this process as a graphics
 *                               process (1, the default) or a compute one (0)
 *   events                      hamiSimEvents: how many events this process holds
 *   event NS                    timing events around one kernel: query, synchronize, elapsed time
 *   stream [NAME [nonblocking]] cuStreamCreate (flags 0, or CU_STREAM_NON_BLOCKING) in the current
 *                               context; `free NAME` destroys it. Where a command takes a STREAM,
 *                               "null" is the legacy default stream
 *   launchon STREAM NS [COUNT]  COUNT busy kernels on STREAM (cuLaunchKernel)
 *   streamsync STREAM | streamquery STREAM
 *                               cuStreamSynchronize / cuStreamQuery
 *   waitvalue STREAM MEM VALUE [geq|eq|and|nor]
 *                               cuStreamWaitValue32_v2 on the first 32-bit word of device memory
 *                               MEM (default eq): STREAM's later work waits until it holds
 *   writevalue STREAM MEM VALUE cuStreamWriteValue32_v2 of that word
 *   alternate CTX_A CTX_B NS COUNT
 *                               COUNT busy kernels, each in the other of two contexts made by
 *                               ctxcreate (cuCtxSetCurrent before each; the busy kernel loaded
 *                               once in each); CTX_B stays current
 *   burn launch|launchex|coop|graph NS SECONDS [SYNC_EVERY [HOST_NS]]
 *                               launch NS kernels for SECONDS of wall time (graph: a graph of 8;
 *                               NS may be a cycle of up to 8 durations, "20000,5000,5000", one
 *                               per launch in turn, as a framework's layer of unequal kernels),
 *                               cuCtxSynchronize every SYNC_EVERY launches (default 64, 0 never)
 *                               and once at the end; HOST_NS of host work (a busy loop) after
 *                               each launch, as a framework's own per-launch cost; reports the
 *                               GPU share achieved
 *
 * Video decoding (NVDEC; libnvcuvid.so.1 is dlopen()ed and its entry points
 * dlsym()ed when one of these is first used, as FFmpeg and PyNvVideoCodec do;
 * decoders, caps and ctxlock need a current context, "ctx DEV" first):
 *   cuvidcaps CODEC CHROMA BITDEPTH
 *                               cuvidGetDecoderCaps: supported, nvdecs, max/min width/height,
 *                               output_mask, max_mb_count
 *   decoder NAME WIDTH HEIGHT SURFACES [OUTSURF [MAXW MAXH]] [KEY=VALUE...]
 *                               cuvidCreateDecoder; OUTSURF (ulNumOutputSurfaces) defaults to 2,
 *                               MAXW/MAXH (ulMaxWidth/Height) to the size. Keys: out=N maxw=W
 *                               maxh=H codec=h264|hevc|av1|mpeg2|vp9|...|N chroma=420|422|444|mono
 *                               bitdepth=8|10|12 target=WxH (ulTargetWidth/Height, default the size)
 *                               format=nv12|p016|yuv444|yuv444_16|nv16|p216|N (default: nv12,
 *                               p016 above 8 bits, the 4:2:2/4:4:4 forms for those chromas)
 *   undecoder NAME              cuvidDestroyDecoder
 *   decode NAME [COUNT]         cuvidDecodePicture COUNT times (default 1) with zeroed parameters;
 *                               stops at the first failure
 *   mapframe NAME PICIDX | mapframe32 NAME PICIDX
 *                               cuvidMapVideoFrame64 / cuvidMapVideoFrame; the pointer is remembered
 *   unmapframe NAME [PTR] | unmapframe32 NAME [PTR]
 *                               cuvidUnmapVideoFrame64 / cuvidUnmapVideoFrame of PTR, else of the
 *                               oldest remembered mapping of that width
 *   reconfigure NAME WIDTH HEIGHT SURFACES [TW TH]
 *                               cuvidReconfigureDecoder (target size TWxTH, default the size)
 *   decodestatus NAME PICIDX    cuvidGetDecodeStatus: status (decodeStatus, 2 = success)
 *   parser NAME [codec=C] | unparser NAME
 *                               cuvidCreateVideoParser (no callbacks) / cuvidDestroyVideoParser
 *   ctxlock                     cuvidCtxLockCreate on the current context, cuvidCtxLock,
 *                               cuCtxGetCurrent, cuvidCtxUnlock, cuvidCtxLockDestroy
 *   cuviddlsym NAME             dlsym in libnvcuvid.so.1 (where the pointer lives)
 *   null cuvidcaps | null decoder
 *                               cuvidGetDecoderCaps(NULL) / cuvidCreateDecoder with a NULL handle
 *                               pointer (rc) and with NULL create info (rc_null_info)
 * A decoder or parser NAME may also be a raw handle 0x... (when no object has
 * that name), to show how a library answers a stale or made-up handle; the
 * real library may crash on one. `free NAME` destroys decoders and parsers
 * too; `freeall` leaves them.
 *
 * The busy kernel is a module the kernel commands load lazily, and the capture
 * stream one they make lazily, in the current context; again when the current
 * context changed, or after the driver called them unknown (INVALID_HANDLE:
 * their context was released and retained again): the command that met the
 * stale handle reports the error, the next one starts afresh. The simulated
 * GPU runs "hami_sim_busy" for the u64 its first parameter points at; on a
 * real GPU the same command loads a PTX kernel of that name that returns at
 * once, so the same scripts run on both.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../src/size.h"
#include "hami/cuda_types.h"
#include "hami/cuvid_types.h"

/* ---- driver types cuda_types.h does not declare -------------------------- */

typedef struct CUctxCreateParams_st CUctxCreateParams;

typedef CUresult (*fn_void)(void);
typedef CUresult (*fn_init)(unsigned int);
typedef CUresult (*fn_int_out)(int *);
typedef CUresult (*fn_device_get)(CUdevice *, int);
typedef CUresult (*fn_device_uuid)(CUuuid *, CUdevice);
typedef CUresult (*fn_total_mem)(size_t *, CUdevice);
typedef CUresult (*fn_primary_retain)(CUcontext *, CUdevice);
typedef CUresult (*fn_primary_release)(CUdevice);
typedef CUresult (*fn_ctx_set)(CUcontext);
typedef CUresult (*fn_ctx_get_device)(CUdevice *);
typedef CUresult (*fn_ctx_create)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*fn_ctx_create_v3)(CUcontext *, void *, int, unsigned int, CUdevice);
typedef CUresult (*fn_ctx_create_v4)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
typedef CUresult (*fn_ctx_destroy)(CUcontext);
typedef CUresult (*fn_mem_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*fn_mem_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult (*fn_mem_managed)(CUdeviceptr *, size_t, unsigned int);
typedef CUresult (*fn_mem_async)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*fn_mem_pool_async)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*fn_mem_free_async)(CUdeviceptr, CUstream);
typedef CUresult (*fn_mem_free)(CUdeviceptr);
typedef CUresult (*fn_mem_info)(size_t *, size_t *);
typedef CUresult (*fn_pool_create)(CUmemoryPool *, const CUmemPoolProps *);
typedef CUresult (*fn_pool_destroy)(CUmemoryPool);
typedef CUresult (*fn_pool_trim)(CUmemoryPool, size_t);
typedef CUresult (*fn_pool_attr)(CUmemoryPool, CUmemPool_attribute, void *);
typedef CUresult (*fn_default_pool)(CUmemoryPool *, CUdevice);
typedef CUresult (*fn_mem_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
				  unsigned long long);
typedef CUresult (*fn_mem_release)(CUmemGenericAllocationHandle);
typedef CUresult (*fn_array_create)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
typedef CUresult (*fn_array3d_create)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
typedef CUresult (*fn_array_destroy)(CUarray);
typedef CUresult (*fn_mipmap_create)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
typedef CUresult (*fn_mipmap_destroy)(CUmipmappedArray);
typedef CUresult (*fn_getproc_v2)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*fn_getproc_v1)(const char *, void **, int, cuuint64_t);
typedef CUresult (*fn_memcpy_htod)(CUdeviceptr, const void *, size_t);
typedef CUresult (*fn_memcpy_dtoh)(void *, CUdeviceptr, size_t);
typedef CUresult (*fn_ckpt_lock)(int, CUcheckpointLockArgs *);
typedef CUresult (*fn_ckpt_step)(int, void *); /* checkpoint, restore, unlock: args always NULL */
typedef CUresult (*fn_ckpt_state)(int, CUprocessState *);
typedef CUresult (*fn_addr_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*fn_addr_free)(CUdeviceptr, size_t);
typedef CUresult (*fn_mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*fn_mem_unmap)(CUdeviceptr, size_t);
typedef CUresult (*fn_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*fn_get_access)(unsigned long long *, const CUmemLocation *, CUdeviceptr);
typedef CUresult (*fn_retain_handle)(CUmemGenericAllocationHandle *, void *);
typedef CUresult (*fn_granularity)(size_t *, const CUmemAllocationProp *, int);
typedef CUresult (*fn_address_range)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*fn_pointer_attrs)(unsigned int, int *, void **, CUdeviceptr);
typedef CUresult (*fn_ipc_handle)(CUipcMemHandle *, CUdeviceptr);
typedef CUresult (*fn_peer_enable)(CUcontext, unsigned int);
typedef int (*fn_sim_fail)(const char *, unsigned int);

typedef struct CUevent_st *CUevent;

/* CUlaunchConfig (CUDA 12): no attributes here. */
struct launch_config {
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	CUstream hStream;
	void *attrs;
	unsigned int numAttrs;
};

typedef CUresult (*fn_ctx_get_current)(CUcontext *);
typedef CUresult (*fn_module_load)(CUmodule *, const void *);
typedef CUresult (*fn_module_unload)(CUmodule);
typedef CUresult (*fn_module_function)(CUfunction *, CUmodule, const char *);
typedef CUresult (*fn_launch)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
			      unsigned int, unsigned int, CUstream, void **, void **);
typedef CUresult (*fn_launch_ex)(const struct launch_config *, CUfunction, void **, void **);
typedef CUresult (*fn_launch_coop)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
				   unsigned int, unsigned int, unsigned int, CUstream, void **);
typedef CUresult (*fn_stream_create)(CUstream *, unsigned int);
typedef CUresult (*fn_begin_capture)(CUstream, int);
typedef CUresult (*fn_end_capture)(CUstream, CUgraph *);
typedef CUresult (*fn_is_capturing)(CUstream, int *);
typedef CUresult (*fn_graph_instantiate)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*fn_graph_launch)(CUgraphExec, CUstream);
typedef CUresult (*fn_graph_exec_destroy)(CUgraphExec);
typedef CUresult (*fn_graph_destroy)(CUgraph);
typedef CUresult (*fn_event_create)(CUevent *, unsigned int);
typedef CUresult (*fn_event)(CUevent); /* destroy, query, synchronize */
typedef CUresult (*fn_event_record)(CUevent, CUstream);
typedef CUresult (*fn_event_elapsed)(float *, CUevent, CUevent);
typedef CUresult (*fn_capture_mode)(int *); /* cuThreadExchangeStreamCaptureMode */
typedef CUresult (*fn_capture_info)(CUstream, int *, cuuint64_t *, CUgraph *, const void **, size_t *);
typedef CUresult (*fn_graph_upload)(CUgraphExec, CUstream);
typedef CUresult (*fn_graph_mem_attr)(CUdevice, int, void *); /* cuDevice{Get,Set}GraphMemAttribute */
typedef CUresult (*fn_graph_mem_trim)(CUdevice);
typedef int (*fn_sim_internal)(int, unsigned long long); /* the simulated GPU's knobs */
typedef int (*fn_sim_graphics)(int);
typedef int (*fn_sim_events)(unsigned long long *);
typedef CUresult (*fn_stream)(CUstream); /* destroy, synchronize, query */
typedef CUresult (*fn_stream_value)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

typedef CUresult (*fn_cuvid_caps)(CUVIDDECODECAPS *);
typedef CUresult (*fn_cuvid_create)(CUvideodecoder *, CUVIDDECODECREATEINFO *);
typedef CUresult (*fn_cuvid_destroy)(CUvideodecoder);
typedef CUresult (*fn_cuvid_decode)(CUvideodecoder, CUVIDPICPARAMS *);
typedef CUresult (*fn_cuvid_status)(CUvideodecoder, int, void *);
typedef CUresult (*fn_cuvid_map64)(CUvideodecoder, int, unsigned long long *, unsigned int *, CUVIDPROCPARAMS *);
typedef CUresult (*fn_cuvid_map32)(CUvideodecoder, int, unsigned int *, unsigned int *, CUVIDPROCPARAMS *);
typedef CUresult (*fn_cuvid_unmap64)(CUvideodecoder, unsigned long long);
typedef CUresult (*fn_cuvid_unmap32)(CUvideodecoder, unsigned int);
typedef CUresult (*fn_cuvid_reconfigure)(CUvideodecoder, CUVIDRECONFIGUREDECODERINFO *);
typedef CUresult (*fn_cuvid_parser_create)(CUvideoparser *, CUVIDPARSERPARAMS *);
typedef CUresult (*fn_cuvid_parser_destroy)(CUvideoparser);
typedef CUresult (*fn_cuvid_lock_create)(CUvideoctxlock *, CUcontext);
typedef CUresult (*fn_cuvid_lock_destroy)(CUvideoctxlock);
typedef CUresult (*fn_cuvid_lock)(CUvideoctxlock, unsigned int);

typedef nvmlReturn_t (*fn_nvml_void)(void);
typedef nvmlReturn_t (*fn_nvml_count)(unsigned int *);
typedef nvmlReturn_t (*fn_nvml_handle)(unsigned int, nvmlDevice_t *);
typedef nvmlReturn_t (*fn_nvml_mem)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*fn_nvml_mem2)(nvmlDevice_t, nvmlMemory_v2_t *);
typedef nvmlReturn_t (*fn_nvml_uuid)(nvmlDevice_t, char *, unsigned int);
typedef nvmlReturn_t (*fn_nvml_procs)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
/* nvmlDeviceGet{Compute,Graphics}RunningProcesses (v1) element. */
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
} nvml_proc_v1;

/* ---- error names ---------------------------------------------------------- */

struct code_name {
	int code;
	const char *name;
};

static const struct code_name cu_names[] = {
	{0, "CUDA_SUCCESS"},
	{1, "CUDA_ERROR_INVALID_VALUE"},
	{2, "CUDA_ERROR_OUT_OF_MEMORY"},
	{3, "CUDA_ERROR_NOT_INITIALIZED"},
	{4, "CUDA_ERROR_DEINITIALIZED"},
	{5, "CUDA_ERROR_PROFILER_DISABLED"},
	{34, "CUDA_ERROR_STUB_LIBRARY"},
	{46, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
	{100, "CUDA_ERROR_NO_DEVICE"},
	{101, "CUDA_ERROR_INVALID_DEVICE"},
	{102, "CUDA_ERROR_DEVICE_NOT_LICENSED"},
	{200, "CUDA_ERROR_INVALID_IMAGE"},
	{201, "CUDA_ERROR_INVALID_CONTEXT"},
	{202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT"},
	{205, "CUDA_ERROR_MAP_FAILED"},
	{206, "CUDA_ERROR_UNMAP_FAILED"},
	{207, "CUDA_ERROR_ARRAY_IS_MAPPED"},
	{208, "CUDA_ERROR_ALREADY_MAPPED"},
	{209, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
	{210, "CUDA_ERROR_ALREADY_ACQUIRED"},
	{211, "CUDA_ERROR_NOT_MAPPED"},
	{214, "CUDA_ERROR_ECC_UNCORRECTABLE"},
	{215, "CUDA_ERROR_UNSUPPORTED_LIMIT"},
	{216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE"},
	{217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"},
	{218, "CUDA_ERROR_INVALID_PTX"},
	{222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"},
	{300, "CUDA_ERROR_INVALID_SOURCE"},
	{301, "CUDA_ERROR_FILE_NOT_FOUND"},
	{304, "CUDA_ERROR_OPERATING_SYSTEM"},
	{400, "CUDA_ERROR_INVALID_HANDLE"},
	{401, "CUDA_ERROR_ILLEGAL_STATE"},
	{500, "CUDA_ERROR_NOT_FOUND"},
	{600, "CUDA_ERROR_NOT_READY"},
	{700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
	{701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
	{702, "CUDA_ERROR_LAUNCH_TIMEOUT"},
	{708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE"},
	{709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
	{710, "CUDA_ERROR_ASSERT"},
	{719, "CUDA_ERROR_LAUNCH_FAILED"},
	{720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"},
	{800, "CUDA_ERROR_NOT_PERMITTED"},
	{801, "CUDA_ERROR_NOT_SUPPORTED"},
	{802, "CUDA_ERROR_SYSTEM_NOT_READY"},
	{803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
	{900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
	{901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
	{908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"},
	{909, "CUDA_ERROR_TIMEOUT"},
	{999, "CUDA_ERROR_UNKNOWN"},
};

static const struct code_name nvml_names[] = {
	{0, "NVML_SUCCESS"},
	{1, "NVML_ERROR_UNINITIALIZED"},
	{2, "NVML_ERROR_INVALID_ARGUMENT"},
	{3, "NVML_ERROR_NOT_SUPPORTED"},
	{4, "NVML_ERROR_NO_PERMISSION"},
	{5, "NVML_ERROR_ALREADY_INITIALIZED"},
	{6, "NVML_ERROR_NOT_FOUND"},
	{7, "NVML_ERROR_INSUFFICIENT_SIZE"},
	{8, "NVML_ERROR_INSUFFICIENT_POWER"},
	{9, "NVML_ERROR_DRIVER_NOT_LOADED"},
	{10, "NVML_ERROR_TIMEOUT"},
	{11, "NVML_ERROR_IRQ_ISSUE"},
	{12, "NVML_ERROR_LIBRARY_NOT_FOUND"},
	{13, "NVML_ERROR_FUNCTION_NOT_FOUND"},
	{14, "NVML_ERROR_CORRUPTED_INFOROM"},
	{15, "NVML_ERROR_GPU_IS_LOST"},
	{16, "NVML_ERROR_RESET_REQUIRED"},
	{17, "NVML_ERROR_OPERATING_SYSTEM"},
	{18, "NVML_ERROR_LIB_RM_VERSION_MISMATCH"},
	{19, "NVML_ERROR_IN_USE"},
	{20, "NVML_ERROR_MEMORY"},
	{21, "NVML_ERROR_NO_DATA"},
	{22, "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED"},
	{23, "NVML_ERROR_INSUFFICIENT_RESOURCES"},
	{24, "NVML_ERROR_FREQ_NOT_SUPPORTED"},
	{25, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH"},
	{26, "NVML_ERROR_DEPRECATED"},
	{27, "NVML_ERROR_NOT_READY"},
	{28, "NVML_ERROR_GPU_NOT_FOUND"},
	{29, "NVML_ERROR_INVALID_STATE"},
	{999, "NVML_ERROR_UNKNOWN"},
};

static void code_name(char *buf, size_t len, int code, bool nvml)
{
	const struct code_name *t = nvml ? nvml_names : cu_names;
	size_t n = nvml ? sizeof(nvml_names) / sizeof(nvml_names[0]) : sizeof(cu_names) / sizeof(cu_names[0]);
	for (size_t i = 0; i < n; i++) {
		if (t[i].code == code) {
			snprintf(buf, len, "%s", t[i].name);
			return;
		}
	}
	snprintf(buf, len, "%s_%d", nvml ? "NVML_ERROR" : "CUDA_ERROR", code);
}

/* ---- one JSON result line ------------------------------------------------- */

#define RC_USAGE (-1)

struct result {
	const char *op;
	int rc;
	bool nvml;            /* rc is an nvmlReturn_t */
	const char *err;      /* overrides the symbolic name (usage errors) */
	char extra[3072];     /* ,"key":value ... */
	size_t len;
};

static void res_init(struct result *r, const char *op)
{
	memset(r, 0, sizeof(*r));
	r->op = op;
}

static void res_raw(struct result *r, const char *fmt, ...)
{
	if (r->len >= sizeof(r->extra) - 1)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(r->extra + r->len, sizeof(r->extra) - r->len, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	r->len += (size_t)n;
	if (r->len >= sizeof(r->extra))
		r->len = sizeof(r->extra) - 1;
}

static void json_escape(char *out, size_t outlen, const char *s)
{
	size_t o = 0;
	if (!s)
		s = "";
	for (; *s && o + 7 < outlen; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\') {
			out[o++] = '\\';
			out[o++] = (char)c;
		} else if (c < 0x20) {
			o += (size_t)snprintf(out + o, outlen - o, "\\u%04x", c);
		} else {
			out[o++] = (char)c;
		}
	}
	out[o] = 0;
}

static void res_str(struct result *r, const char *key, const char *val)
{
	char esc[1024];
	json_escape(esc, sizeof(esc), val);
	res_raw(r, ",\"%s\":\"%s\"", key, esc);
}

static void res_u64(struct result *r, const char *key, unsigned long long v)
{
	res_raw(r, ",\"%s\":%llu", key, v);
}

static void res_i64(struct result *r, const char *key, long long v)
{
	res_raw(r, ",\"%s\":%lld", key, v);
}

static void res_hex(struct result *r, const char *key, const void *p)
{
	res_raw(r, ",\"%s\":\"0x%llx\"", key, (unsigned long long)(uintptr_t)p);
}

static void res_emit(struct result *r)
{
	char name[64];
	printf("{\"op\":\"%s\",\"pid\":%d,\"rc\":%d", r->op, (int)getpid(), r->rc);
	if (r->err) {
		printf(",\"err\":\"%s\"", r->err);
	} else if (r->rc != 0) {
		code_name(name, sizeof(name), r->rc, r->nvml);
		printf(",\"err\":\"%s\"", name);
	}
	printf("%s}\n", r->extra);
	fflush(stdout);
}

static void usage_error(const char *op, const char *err, const char *fmt, ...)
{
	struct result r;
	char detail[512];
	va_list ap;
	res_init(&r, op);
	r.rc = RC_USAGE;
	r.err = err;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	res_str(&r, "detail", detail);
	res_emit(&r);
}

/* ---- library handles and entry point resolution --------------------------- */

/* dlsym(libcuda handle), dlsym(RTLD_NEXT), dlsym(RTLD_DEFAULT), cuGetProcAddress_v2 / cuGetProcAddress */
enum resolve_mode { RESOLVE_DLSYM, RESOLVE_NEXT, RESOLVE_DEFAULT, RESOLVE_PROCADDR, RESOLVE_PROCADDR1 };

static void *libcuda;
static void *libnvml;
static void *libcuvid;
static enum resolve_mode mode = RESOLVE_DLSYM;
static int proc_version = 12000;
static unsigned long long proc_flags = 0;

enum fn_id {
	F_INIT,
	F_DEVICE_GET_COUNT,
	F_DEVICE_GET,
	F_DEVICE_GET_UUID,
	F_DEVICE_TOTAL_MEM,
	F_PRIMARY_RETAIN,
	F_PRIMARY_RELEASE,
	F_CTX_SET_CURRENT,
	F_CTX_GET_DEVICE,
	F_CTX_CREATE,
	F_CTX_DESTROY,
	F_CTX_SYNCHRONIZE,
	F_MEM_ALLOC,
	F_MEM_ALLOC_PITCH,
	F_MEM_ALLOC_MANAGED,
	F_MEM_ALLOC_ASYNC,
	F_MEM_ALLOC_FROM_POOL_ASYNC,
	F_MEM_FREE_ASYNC,
	F_MEM_FREE,
	F_MEM_GET_INFO,
	F_POOL_CREATE,
	F_POOL_DESTROY,
	F_POOL_TRIM,
	F_POOL_GET_ATTR,
	F_DEFAULT_POOL,
	F_MEM_CREATE,
	F_MEM_RELEASE,
	F_ARRAY_CREATE,
	F_ARRAY3D_CREATE,
	F_ARRAY_DESTROY,
	F_MIPMAP_CREATE,
	F_MIPMAP_DESTROY,
	F_CTX_GET_CURRENT,
	F_MODULE_LOAD_DATA,
	F_MODULE_UNLOAD,
	F_MODULE_GET_FUNCTION,
	F_LAUNCH_KERNEL,
	F_LAUNCH_KERNEL_EX,
	F_LAUNCH_COOPERATIVE,
	F_STREAM_CREATE,
	F_BEGIN_CAPTURE,
	F_END_CAPTURE,
	F_IS_CAPTURING,
	F_GRAPH_INSTANTIATE,
	F_GRAPH_LAUNCH,
	F_GRAPH_EXEC_DESTROY,
	F_GRAPH_DESTROY,
	F_EVENT_CREATE,
	F_EVENT_RECORD,
	F_EVENT_QUERY,
	F_EVENT_SYNCHRONIZE,
	F_EVENT_ELAPSED,
	F_EVENT_DESTROY,
	F_MEMCPY_HTOD,
	F_MEMCPY_DTOH,
	F_CKPT_LOCK,
	F_CKPT_CHECKPOINT,
	F_CKPT_RESTORE,
	F_CKPT_UNLOCK,
	F_CKPT_STATE,
	F_CAPTURE_MODE,
	F_CAPTURE_INFO,
	F_GRAPH_UPLOAD,
	F_GRAPH_MEM_GET_ATTR,
	F_GRAPH_MEM_SET_ATTR,
	F_GRAPH_MEM_TRIM,
	F_STREAM_DESTROY,
	F_STREAM_SYNCHRONIZE,
	F_STREAM_QUERY,
	F_STREAM_WAIT_VALUE,
	F_STREAM_WRITE_VALUE,
	F_ADDR_RESERVE,
	F_ADDR_FREE,
	F_MEM_MAP,
	F_MEM_UNMAP,
	F_SET_ACCESS,
	F_GET_ACCESS,
	F_RETAIN_HANDLE,
	F_GRANULARITY,
	F_ADDRESS_RANGE,
	F_POINTER_ATTRS,
	F_IPC_HANDLE,
	F_PEER_ENABLE,
	F_COUNT
};

struct fn_entry {
	const char *symbol; /* exported name, for dlsym */
	const char *base;   /* base name, for cuGetProcAddress */
};

static const struct fn_entry fn_table[F_COUNT] = {
	[F_INIT] = {"cuInit", "cuInit"},
	[F_DEVICE_GET_COUNT] = {"cuDeviceGetCount", "cuDeviceGetCount"},
	[F_DEVICE_GET] = {"cuDeviceGet", "cuDeviceGet"},
	[F_DEVICE_GET_UUID] = {"cuDeviceGetUuid", "cuDeviceGetUuid"},
	[F_DEVICE_TOTAL_MEM] = {"cuDeviceTotalMem_v2", "cuDeviceTotalMem"},
	[F_PRIMARY_RETAIN] = {"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain"},
	[F_PRIMARY_RELEASE] = {"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"},
	[F_CTX_SET_CURRENT] = {"cuCtxSetCurrent", "cuCtxSetCurrent"},
	[F_CTX_GET_DEVICE] = {"cuCtxGetDevice", NULL}, /* CUDA 13 has a _v2 with a context argument */
	[F_CTX_CREATE] = {"cuCtxCreate_v2", "cuCtxCreate"},
	[F_CTX_DESTROY] = {"cuCtxDestroy_v2", "cuCtxDestroy"},
	/* Always through dlsym: newer headers give the base name another signature. */
	[F_CTX_SYNCHRONIZE] = {"cuCtxSynchronize", NULL},
	[F_MEM_ALLOC] = {"cuMemAlloc_v2", "cuMemAlloc"},
	[F_MEM_ALLOC_PITCH] = {"cuMemAllocPitch_v2", "cuMemAllocPitch"},
	[F_MEM_ALLOC_MANAGED] = {"cuMemAllocManaged", "cuMemAllocManaged"},
	[F_MEM_ALLOC_ASYNC] = {"cuMemAllocAsync", "cuMemAllocAsync"},
	[F_MEM_ALLOC_FROM_POOL_ASYNC] = {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync"},
	[F_MEM_FREE_ASYNC] = {"cuMemFreeAsync", "cuMemFreeAsync"},
	[F_MEM_FREE] = {"cuMemFree_v2", "cuMemFree"},
	[F_MEM_GET_INFO] = {"cuMemGetInfo_v2", "cuMemGetInfo"},
	[F_POOL_CREATE] = {"cuMemPoolCreate", "cuMemPoolCreate"},
	[F_POOL_DESTROY] = {"cuMemPoolDestroy", "cuMemPoolDestroy"},
	[F_POOL_TRIM] = {"cuMemPoolTrimTo", "cuMemPoolTrimTo"},
	[F_POOL_GET_ATTR] = {"cuMemPoolGetAttribute", "cuMemPoolGetAttribute"},
	[F_DEFAULT_POOL] = {"cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool"},
	[F_MEM_CREATE] = {"cuMemCreate", "cuMemCreate"},
	[F_MEM_RELEASE] = {"cuMemRelease", "cuMemRelease"},
	[F_ARRAY_CREATE] = {"cuArrayCreate_v2", "cuArrayCreate"},
	[F_ARRAY3D_CREATE] = {"cuArray3DCreate_v2", "cuArray3DCreate"},
	[F_ARRAY_DESTROY] = {"cuArrayDestroy", "cuArrayDestroy"},
	[F_MIPMAP_CREATE] = {"cuMipmappedArrayCreate", "cuMipmappedArrayCreate"},
	[F_MIPMAP_DESTROY] = {"cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy"},
	[F_CTX_GET_CURRENT] = {"cuCtxGetCurrent", "cuCtxGetCurrent"},
	[F_MODULE_LOAD_DATA] = {"cuModuleLoadData", "cuModuleLoadData"},
	[F_MODULE_UNLOAD] = {"cuModuleUnload", "cuModuleUnload"},
	[F_MODULE_GET_FUNCTION] = {"cuModuleGetFunction", "cuModuleGetFunction"},
	[F_LAUNCH_KERNEL] = {"cuLaunchKernel", "cuLaunchKernel"},
	[F_LAUNCH_KERNEL_EX] = {"cuLaunchKernelEx", "cuLaunchKernelEx"},
	[F_LAUNCH_COOPERATIVE] = {"cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel"},
	[F_STREAM_CREATE] = {"cuStreamCreate", "cuStreamCreate"},
	/* Below CUDA 10.1 cuGetProcAddress gives the one-argument form; the
	 * extra mode argument it is passed then is ignored by the C ABI. */
	[F_BEGIN_CAPTURE] = {"cuStreamBeginCapture_v2", "cuStreamBeginCapture"},
	[F_END_CAPTURE] = {"cuStreamEndCapture", "cuStreamEndCapture"},
	[F_IS_CAPTURING] = {"cuStreamIsCapturing", "cuStreamIsCapturing"},
	[F_GRAPH_INSTANTIATE] = {"cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags"},
	[F_GRAPH_LAUNCH] = {"cuGraphLaunch", "cuGraphLaunch"},
	[F_GRAPH_EXEC_DESTROY] = {"cuGraphExecDestroy", "cuGraphExecDestroy"},
	[F_GRAPH_DESTROY] = {"cuGraphDestroy", "cuGraphDestroy"},
	[F_EVENT_CREATE] = {"cuEventCreate", "cuEventCreate"},
	[F_EVENT_RECORD] = {"cuEventRecord", "cuEventRecord"},
	[F_EVENT_QUERY] = {"cuEventQuery", "cuEventQuery"},
	[F_EVENT_SYNCHRONIZE] = {"cuEventSynchronize", "cuEventSynchronize"},
	[F_EVENT_ELAPSED] = {"cuEventElapsedTime", "cuEventElapsedTime"},
	[F_EVENT_DESTROY] = {"cuEventDestroy_v2", "cuEventDestroy"},
	[F_MEMCPY_HTOD] = {"cuMemcpyHtoD_v2", "cuMemcpyHtoD"},
	[F_MEMCPY_DTOH] = {"cuMemcpyDtoH_v2", "cuMemcpyDtoH"},
	[F_CKPT_LOCK] = {"cuCheckpointProcessLock", "cuCheckpointProcessLock"},
	[F_CKPT_CHECKPOINT] = {"cuCheckpointProcessCheckpoint", "cuCheckpointProcessCheckpoint"},
	[F_CKPT_RESTORE] = {"cuCheckpointProcessRestore", "cuCheckpointProcessRestore"},
	[F_CKPT_UNLOCK] = {"cuCheckpointProcessUnlock", "cuCheckpointProcessUnlock"},
	[F_CKPT_STATE] = {"cuCheckpointProcessGetState", "cuCheckpointProcessGetState"},
	[F_CAPTURE_MODE] = {"cuThreadExchangeStreamCaptureMode", "cuThreadExchangeStreamCaptureMode"},
	/* Always through dlsym: the base name's form (and signature) depends on the version. */
	[F_CAPTURE_INFO] = {"cuStreamGetCaptureInfo_v2", NULL},
	[F_GRAPH_UPLOAD] = {"cuGraphUpload", "cuGraphUpload"},
	[F_GRAPH_MEM_GET_ATTR] = {"cuDeviceGetGraphMemAttribute", "cuDeviceGetGraphMemAttribute"},
	[F_GRAPH_MEM_SET_ATTR] = {"cuDeviceSetGraphMemAttribute", "cuDeviceSetGraphMemAttribute"},
	[F_GRAPH_MEM_TRIM] = {"cuDeviceGraphMemTrim", "cuDeviceGraphMemTrim"},
	[F_STREAM_DESTROY] = {"cuStreamDestroy_v2", "cuStreamDestroy"},
	[F_STREAM_SYNCHRONIZE] = {"cuStreamSynchronize", "cuStreamSynchronize"},
	[F_STREAM_QUERY] = {"cuStreamQuery", "cuStreamQuery"},
	/* The _v2 forms (CUDA 11.7); cuGetProcAddress gives them from 11070. */
	[F_STREAM_WAIT_VALUE] = {"cuStreamWaitValue32_v2", "cuStreamWaitValue32"},
	[F_STREAM_WRITE_VALUE] = {"cuStreamWriteValue32_v2", "cuStreamWriteValue32"},
	[F_ADDR_RESERVE] = {"cuMemAddressReserve", "cuMemAddressReserve"},
	[F_ADDR_FREE] = {"cuMemAddressFree", "cuMemAddressFree"},
	[F_MEM_MAP] = {"cuMemMap", "cuMemMap"},
	[F_MEM_UNMAP] = {"cuMemUnmap", "cuMemUnmap"},
	[F_SET_ACCESS] = {"cuMemSetAccess", "cuMemSetAccess"},
	[F_GET_ACCESS] = {"cuMemGetAccess", "cuMemGetAccess"},
	[F_RETAIN_HANDLE] = {"cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle"},
	[F_GRANULARITY] = {"cuMemGetAllocationGranularity", "cuMemGetAllocationGranularity"},
	[F_ADDRESS_RANGE] = {"cuMemGetAddressRange_v2", "cuMemGetAddressRange"},
	[F_POINTER_ATTRS] = {"cuPointerGetAttributes", "cuPointerGetAttributes"},
	[F_IPC_HANDLE] = {"cuIpcGetMemHandle", "cuIpcGetMemHandle"},
	[F_PEER_ENABLE] = {"cuCtxEnablePeerAccess", "cuCtxEnablePeerAccess"},
};

static void *fn_cache[F_COUNT];
static bool fn_cached[F_COUNT];
static char resolve_error[512];

static bool open_libcuda(void)
{
	if (libcuda)
		return true;
	libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!libcuda) {
		const char *e = dlerror();
		snprintf(resolve_error, sizeof(resolve_error), "dlopen libcuda.so.1: %s", e ? e : "failed");
		return false;
	}
	return true;
}

static bool open_libnvml(void)
{
	if (libnvml)
		return true;
	libnvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!libnvml) {
		const char *e = dlerror();
		snprintf(resolve_error, sizeof(resolve_error), "dlopen libnvidia-ml.so.1: %s", e ? e : "failed");
		return false;
	}
	return true;
}

static bool open_libcuvid(void)
{
	if (libcuvid)
		return true;
	libcuvid = dlopen("libnvcuvid.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!libcuvid) {
		const char *e = dlerror();
		snprintf(resolve_error, sizeof(resolve_error), "dlopen libnvcuvid.so.1: %s", e ? e : "failed");
		return false;
	}
	return true;
}

static void *cuvid_dlsym(const char *name)
{
	if (!open_libcuvid())
		return NULL;
	dlerror();
	void *p = dlsym(libcuvid, name);
	if (!p) {
		const char *e = dlerror();
		snprintf(resolve_error, sizeof(resolve_error), "dlsym %s: %s", name, e ? e : "not found");
	}
	return p;
}

static void *cuda_dlsym_in(void *handle, const char *name)
{
	if (!open_libcuda())
		return NULL;
	dlerror();
	void *p = dlsym(handle ? handle : libcuda, name);
	if (!p) {
		const char *e = dlerror();
		snprintf(resolve_error, sizeof(resolve_error), "dlsym %s: %s", name, e ? e : "not found");
	}
	return p;
}

static void *cuda_dlsym(const char *name)
{
	return cuda_dlsym_in(NULL, name);
}

static void *nvml_dlsym(const char *name)
{
	if (!open_libnvml())
		return NULL;
	dlerror();
	void *p = dlsym(libnvml, name);
	if (!p) {
		const char *e = dlerror();
		snprintf(resolve_error, sizeof(resolve_error), "dlsym %s: %s", name, e ? e : "not found");
	}
	return p;
}

/* Set when get_proc could not find cuGetProcAddress itself (resolve_error says why). */
static bool getproc_missing;

/* cuGetProcAddress_v2 / cuGetProcAddress as the process sees them (via dlsym). */
static CUresult get_proc(bool v1, const char *base, void **out, int version, unsigned long long flags,
			 CUdriverProcAddressQueryResult *status)
{
	if (v1) {
		fn_getproc_v1 f = (fn_getproc_v1)cuda_dlsym("cuGetProcAddress");
		getproc_missing = !f;
		if (!f)
			return CUDA_ERROR_NOT_FOUND;
		if (status)
			*status = CU_GET_PROC_ADDRESS_SUCCESS;
		return f(base, out, version, flags);
	}
	fn_getproc_v2 f = (fn_getproc_v2)cuda_dlsym("cuGetProcAddress_v2");
	getproc_missing = !f;
	if (!f)
		return CUDA_ERROR_NOT_FOUND;
	return f(base, out, version, flags, status);
}

static void *resolve(enum fn_id id)
{
	if (fn_cached[id])
		return fn_cache[id];
	const struct fn_entry *e = &fn_table[id];
	void *p = NULL;
	if (mode == RESOLVE_NEXT || mode == RESOLVE_DEFAULT) {
		/* libcuda is open RTLD_GLOBAL: these find whatever comes first after
		 * (or from) the program, as an application's own lookups do. */
		p = cuda_dlsym_in(mode == RESOLVE_NEXT ? RTLD_NEXT : RTLD_DEFAULT, e->symbol);
	} else if (mode == RESOLVE_DLSYM || !e->base) {
		p = cuda_dlsym(e->symbol);
	} else {
		CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
		CUresult rc = get_proc(mode == RESOLVE_PROCADDR1, e->base, &p, proc_version, proc_flags, &st);
		if ((rc != CUDA_SUCCESS || !p) && !getproc_missing) {
			snprintf(resolve_error, sizeof(resolve_error), "cuGetProcAddress%s %s: rc %d status %d",
				 mode == RESOLVE_PROCADDR1 ? "" : "_v2", e->base, rc, (int)st);
			p = NULL;
		}
	}
	if (p) {
		fn_cache[id] = p;
		fn_cached[id] = true;
	}
	return p;
}

/* Resolve F into a typed variable or finish the command with NOT_FOUND. */
#define NEED(var, type, id)                                                   \
	type var = (type)resolve(id);                                         \
	if (!var) {                                                           \
		r->rc = CUDA_ERROR_NOT_FOUND;                                 \
		res_str(r, "detail", resolve_error);                          \
		return 0;                                                     \
	}

#define NEED_CUVID(var, type, name)                                           \
	type var = (type)cuvid_dlsym(name);                                   \
	if (!var) {                                                           \
		r->rc = CUDA_ERROR_NOT_FOUND;                                 \
		res_str(r, "detail", resolve_error);                          \
		return 0;                                                     \
	}

#define NEED_NVML(var, type, name)                                            \
	type var = (type)nvml_dlsym(name);                                    \
	if (!var) {                                                           \
		r->rc = NVML_ERROR_FUNCTION_NOT_FOUND;                        \
		res_str(r, "detail", resolve_error);                          \
		return 0;                                                     \
	}

/* ---- named objects --------------------------------------------------------- */

enum obj_kind {
	K_MEM,      /* cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemAllocManaged: cuMemFree_v2 */
	K_ASYNC,    /* cuMemAllocAsync, cuMemAllocFromPoolAsync: cuMemFreeAsync */
	K_ARRAY,    /* cuArrayDestroy */
	K_MIPMAP,   /* cuMipmappedArrayDestroy */
	K_HANDLE,   /* cuMemCreate: cuMemRelease */
	K_POOL,     /* cuMemPoolDestroy */
	K_CTX,      /* cuCtxDestroy_v2 */
	K_DECODER,  /* cuvidDestroyDecoder */
	K_PARSER,   /* cuvidDestroyVideoParser */
	K_STREAM,   /* cuStreamDestroy_v2 */
	K_RANGE,    /* cuMemAddressReserve: cuMemAddressFree */
	K_VMEM      /* vmalloc, a program's own mapped memory: cuMemUnmap, cuMemRelease, cuMemAddressFree */
};

static const char *kind_name[] = {"mem", "async", "array", "mipmap", "handle", "pool", "ctx", "decoder", "parser",
				  "stream", "range", "vmem"};

#define NAME_LEN 64

struct obj {
	char name[NAME_LEN];
	enum obj_kind kind;
	CUdeviceptr ptr;
	CUmemGenericAllocationHandle handle;
	void *h; /* CUarray, CUmipmappedArray, CUmemoryPool, CUcontext */
	unsigned long long size;
};

static struct obj *objs;
static size_t nobjs, capobjs;
static unsigned long auto_counter;
static unsigned long fill_counter;

static struct obj *obj_find(const char *name)
{
	for (size_t i = 0; i < nobjs; i++)
		if (strcmp(objs[i].name, name) == 0)
			return &objs[i];
	return NULL;
}

static struct obj *obj_add(const char *name, enum obj_kind kind)
{
	if (nobjs == capobjs) {
		size_t ncap = capobjs ? capobjs * 2 : 64;
		struct obj *n = realloc(objs, ncap * sizeof(*n));
		if (!n)
			return NULL;
		objs = n;
		capobjs = ncap;
	}
	struct obj *o = &objs[nobjs++];
	memset(o, 0, sizeof(*o));
	snprintf(o->name, sizeof(o->name), "%s", name);
	o->kind = kind;
	return o;
}

static void obj_remove(struct obj *o)
{
	size_t i = (size_t)(o - objs);
	memmove(&objs[i], &objs[i + 1], (nobjs - i - 1) * sizeof(*objs));
	nobjs--;
}

/* ---- token streams ---------------------------------------------------------- */

struct stream {
	char **tok;
	int n;
	int pos;
	bool is_stdin; /* the stream is standard input, line by line */
};

static const char *const command_words[] = {
	"init", "count", "ctx", "ctxrelease", "ctxcreate", "ctxdestroy", "alloc", "pitch", "managed",
	"async", "pool", "poolalloc", "poolattr", "pooltrim", "pooldestroy", "memcreate", "array",
	"array3d", "mipmap", "free", "freeraw", "freeall", "meminfo", "totalmem", "uuid", "sync", "fill",
	"race", "churn", "null", "getproc", "getproc1", "dlsym", "nvmldlsym", "resolve", "nvml", "nvmlcount",
	"nvmlmem", "nvmluuid", "nvmlshutdown", "nvmlprocs", "sleep", "child", "endchild", "hold", "exit", "stdin",
	"echo", "list", "waitfile", "module", "launch", "launchex", "coop", "capture", "graph",
	"graphlaunch", "event", "burn", "threads", "cuvidcaps", "decoder", "undecoder", "decode", "mapframe",
	"unmapframe", "mapframe32", "unmapframe32", "reconfigure", "decodestatus", "parser", "unparser",
	"ctxlock", "cuviddlsym", "write", "check", "ckpt", "freeasync", "capturemode", "ungraph", "graphupload",
	"graphmem", "graphmemreset", "graphtrim", "nvmlgraphics", "internal", "graphics", "worker", "endworker",
	"stream", "launchon", "streamsync", "streamquery", "waitvalue", "writevalue", "alternate", "events",
	"vmalloc", "vm", "touch", "range", "ptrattr", "ipc", "peer", "simfail", "handle", NULL};

static bool is_command_word(const char *w)
{
	for (int i = 0; command_words[i]; i++)
		if (strcmp(command_words[i], w) == 0)
			return true;
	return false;
}

static const char *next_arg(struct stream *s)
{
	if (s->pos >= s->n)
		return NULL;
	return s->tok[s->pos++];
}

/* An optional argument: the next word, unless it starts another command. */
static const char *opt_arg(struct stream *s)
{
	if (s->pos >= s->n || is_command_word(s->tok[s->pos]))
		return NULL;
	return s->tok[s->pos++];
}

static bool parse_u64(const char *s, unsigned long long *out)
{
	char *end;
	if (!s || !*s || *s == '-')
		return false;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || *end)
		return false;
	*out = v;
	return true;
}

/* A duration in seconds, 0 to a day. */
static bool parse_seconds(const char *s, double *out)
{
	char *end = NULL;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= 0 && v <= 86400))
		return false;
	*out = v;
	return true;
}

static bool parse_int(const char *s, long long *out)
{
	char *end;
	if (!s || !*s)
		return false;
	errno = 0;
	long long v = strtoll(s, &end, 0);
	if (errno || *end)
		return false;
	*out = v;
	return true;
}

/* The preload library's size grammar (native/src/size.c). */
static bool parse_size(const char *s, unsigned long long *out)
{
	uint64_t v;
	if (hami_parse_size(s, &v) < 0)
		return false;
	*out = v;
	return true;
}

static bool parse_format(const char *s, CUarray_format *f, unsigned *elem)
{
	static const struct {
		const char *name;
		CUarray_format fmt;
		unsigned bytes;
	} t[] = {
		{"u8", CU_AD_FORMAT_UNSIGNED_INT8, 1},  {"u16", CU_AD_FORMAT_UNSIGNED_INT16, 2},
		{"u32", CU_AD_FORMAT_UNSIGNED_INT32, 4}, {"i8", CU_AD_FORMAT_SIGNED_INT8, 1},
		{"i16", CU_AD_FORMAT_SIGNED_INT16, 2},  {"i32", CU_AD_FORMAT_SIGNED_INT32, 4},
		{"f16", CU_AD_FORMAT_HALF, 2},          {"f32", CU_AD_FORMAT_FLOAT, 4},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		if (strcmp(s, t[i].name) == 0) {
			*f = t[i].fmt;
			*elem = t[i].bytes;
			return true;
		}
	}
	return false;
}

/* ---- command context ------------------------------------------------------- */

/*
 * A handler returns 0 when its result is in *r (emitted by the caller), or -1
 * for a usage error it has already reported (the rest of the line is dropped).
 */
typedef int (*handler_fn)(struct stream *s, struct result *r);

#define ARG(var, what)                                                          \
	const char *var = next_arg(s);                                          \
	if (!var) {                                                             \
		usage_error(r->op, "CUDRIVE_USAGE", "missing argument: %s", what); \
		return -1;                                                      \
	}

#define SIZE_ARG(var, what)                                                     \
	unsigned long long var;                                                 \
	{                                                                       \
		ARG(var##_s, what);                                             \
		if (!parse_size(var##_s, &var)) {                               \
			usage_error(r->op, "CUDRIVE_USAGE", "bad %s: \"%s\"", what, var##_s); \
			return -1;                                              \
		}                                                               \
	}

#define INT_ARG(var, what)                                                      \
	long long var;                                                          \
	{                                                                       \
		ARG(var##_s, what);                                             \
		if (!parse_int(var##_s, &var)) {                                \
			usage_error(r->op, "CUDRIVE_USAGE", "bad %s: \"%s\"", what, var##_s); \
			return -1;                                              \
		}                                                               \
	}

#define U64_ARG(var, what)                                                      \
	unsigned long long var;                                                 \
	{                                                                       \
		ARG(var##_s, what);                                             \
		if (!parse_u64(var##_s, &var)) {                                \
			usage_error(r->op, "CUDRIVE_USAGE", "bad %s: \"%s\"", what, var##_s); \
			return -1;                                              \
		}                                                               \
	}

/* Pick the name for a new object: the optional NAME, else prefix + counter. */
static int new_name(struct stream *s, struct result *r, char *name, const char *prefix)
{
	const char *given = opt_arg(s);
	if (given) {
		if (strlen(given) >= NAME_LEN) {
			usage_error(r->op, "CUDRIVE_USAGE", "name too long: \"%s\"", given);
			return -1;
		}
		if (obj_find(given)) {
			usage_error(r->op, "CUDRIVE_NAME_IN_USE", "name in use: \"%s\"", given);
			return -1;
		}
		snprintf(name, NAME_LEN, "%s", given);
		return 0;
	}
	do
		snprintf(name, NAME_LEN, "%s%lu", prefix, auto_counter++);
	while (obj_find(name));
	return 0;
}

static struct obj *store(struct result *r, const char *name, enum obj_kind kind)
{
	struct obj *o = obj_add(name, kind);
	if (!o) {
		res_str(r, "detail", "out of host memory for the object table");
		return NULL;
	}
	res_str(r, "name", name);
	return o;
}

static CUresult device_get(struct result *r, long long ordinal, CUdevice *dev)
{
	fn_device_get f = (fn_device_get)resolve(F_DEVICE_GET);
	if (!f) {
		res_str(r, "detail", resolve_error);
		return CUDA_ERROR_NOT_FOUND;
	}
	return f(dev, (int)ordinal);
}

/* ---- driver commands ------------------------------------------------------ */

static int cmd_init(struct stream *s, struct result *r)
{
	NEED(f, fn_init, F_INIT);
	r->rc = f(0);
	return 0;
}

static int cmd_count(struct stream *s, struct result *r)
{
	NEED(f, fn_int_out, F_DEVICE_GET_COUNT);
	int n = 0;
	r->rc = f(&n);
	if (r->rc == 0)
		res_i64(r, "count", n);
	return 0;
}

static int cmd_ctx(struct stream *s, struct result *r)
{
	INT_ARG(ord, "DEV");
	NEED(retain, fn_primary_retain, F_PRIMARY_RETAIN);
	NEED(set, fn_ctx_set, F_CTX_SET_CURRENT);
	CUdevice dev;
	CUcontext ctx = NULL;
	res_i64(r, "dev", ord);
	if ((r->rc = device_get(r, ord, &dev)) != 0)
		return 0;
	if ((r->rc = retain(&ctx, dev)) != 0)
		return 0;
	r->rc = set(ctx);
	res_hex(r, "ctx", ctx);
	return 0;
}

static int cmd_ctxrelease(struct stream *s, struct result *r)
{
	INT_ARG(ord, "DEV");
	NEED(release, fn_primary_release, F_PRIMARY_RELEASE);
	CUdevice dev;
	res_i64(r, "dev", ord);
	if ((r->rc = device_get(r, ord, &dev)) != 0)
		return 0;
	r->rc = release(dev);
	return 0;
}

static int cmd_ctxcreate(struct stream *s, struct result *r)
{
	char name[NAME_LEN];
	INT_ARG(ord, "DEV");
	if (new_name(s, r, name, "c") < 0)
		return -1;
	NEED(f, void *, F_CTX_CREATE);
	CUdevice dev;
	CUcontext ctx = NULL;
	res_i64(r, "dev", ord);
	if ((r->rc = device_get(r, ord, &dev)) != 0)
		return 0;
	/*
	 * cuGetProcAddress("cuCtxCreate") gives cuCtxCreate_v3 (CUDA >= 11.4,
	 * execution-affinity parameters) or _v4 (CUDA >= 13, a params struct),
	 * each with its own signature. Call what was returned: its symbol name
	 * says which, else the requested version does.
	 */
	int api = 2;
	Dl_info info;
	const char *sym = NULL;
	if (dladdr(f, &info) && info.dli_sname)
		sym = info.dli_sname;
	if (sym && strstr(sym, "cuCtxCreate") == sym) {
		const char *v = strrchr(sym, '_');
		api = v && strcmp(v, "_v4") == 0 ? 4 : v && strcmp(v, "_v3") == 0 ? 3 : 2;
	} else if (mode == RESOLVE_PROCADDR || mode == RESOLVE_PROCADDR1) {
		api = proc_version >= 13000 ? 4 : proc_version >= 11040 ? 3 : 2;
	}
	if (api == 4)
		r->rc = ((fn_ctx_create_v4)f)(&ctx, NULL, 0, dev);
	else if (api == 3)
		r->rc = ((fn_ctx_create_v3)f)(&ctx, NULL, 0, 0, dev);
	else
		r->rc = ((fn_ctx_create)f)(&ctx, 0, dev);
	res_i64(r, "api", api);
	if (r->rc == 0) {
		struct obj *o = store(r, name, K_CTX);
		if (o)
			o->h = ctx;
		res_hex(r, "ctx", ctx);
	}
	return 0;
}

static int cmd_alloc(struct stream *s, struct result *r)
{
	char name[NAME_LEN];
	SIZE_ARG(size, "SIZE");
	if (new_name(s, r, name, "a") < 0)
		return -1;
	NEED(f, fn_mem_alloc, F_MEM_ALLOC);
	CUdeviceptr p = 0;
	res_u64(r, "size", size);
	r->rc = f(&p, (size_t)size);
	if (r->rc == 0) {
		struct obj *o = store(r, name, K_MEM);
		if (o) {
			o->ptr = p;
			o->size = size;
		}
		res_u64(r, "ptr", p);
	}
	return 0;
}

static int cmd_pitch(struct stream *s, struct result *r)
{
	char name[NAME_LEN];
	SIZE_ARG(width, "WIDTH");
	SIZE_ARG(height, "HEIGHT");
	INT_ARG(elem, "ELEMBYTES");
	if (new_name(s, r, name, "a") < 0)
		return -1;
	NEED(f, fn_mem_pitch, F_MEM_ALLOC_PITCH);
	CUdeviceptr p = 0;
	size_t pitch = 0;
	r->rc = f(&p, &pitch, (size_t)width, (size_t)height, (unsigned int)elem);
	if (r->rc == 0) {
		struct obj *o = store(r, name, K_MEM);
		if (o) {
			o->ptr = p;
			o->size = (unsigned long long)pitch * height;
		}
		res_u64(r, "ptr", p);
		res_u64(r, "pitch", pitch);
		res_u64(r, "size", (unsigned long long)pitch * height);
	}
	return 0;
}

static int cmd_managed(struct stream *s, struct result *r)
{
	char name[NAME_LEN];
	SIZE_ARG(size, "SIZE");
	if (new_name(s, r, name, "a") < 0)
		return -1;
	NEED(f, fn_mem_managed, F_MEM_ALLOC_MANAGED);
	CUdeviceptr p = 0;
	res_u64(r, "size", size);
	r->rc = f(&p, (size_t)size, CU_MEM_ATTACH_GLOBAL);
	if (r->rc == 0) {
		struct obj *o = store(r, name, K_MEM);
		if (o) {
			o->ptr = p;
			o->size = size;
		}
		res_u64(r, "ptr", p);
	}
	return 0;
}

/* While `capture begin` is under way, stream-ordered commands (async,
 * poolalloc, the free of their memory, freeasync) go to the capture stream:
 * graph memory nodes. Defined with the capture commands. */
static bool capturing_stream(CUstream *s);

static int cmd_async(struct stream *s, struct result *r)
{
	char name[NAME_LEN];
	SIZE_ARG(size, "SIZE");
	if (new_name(s, r, name, "a") < 0)
		return -1;
	NEED(f, fn_mem_async, F_MEM_ALLOC_ASYNC);
	CUdeviceptr p = 0;
	CUstream st = NULL;
	res_u64(r, "size", size);
	res_str(r, "stream", capturing_stream(&st) ? "capture" : "null");
	r->rc = f(&p, (size_t)size, st);
	if (r->rc == 0) {
		struct obj *o = store(r, name, K_ASYNC);
		if (o) {
			o->ptr = p;
			o->size = size;
		}
		res_u64(r, "ptr", p);
	}
	return 0;
}

static int cmd_pool(struct stream *s, struct result *r)
{
	char name[NAME_LEN];
	INT_ARG(ord, "DEV");
	if (new_name(s, r, name, "p") < 0)
		return -1;
	NEED(f, fn_pool_create, F_POOL_CREATE);
	CUmemPoolProps props;
	memset(&props, 0, sizeof(props));
	props.allocType = 1; /* CU_MEM_ALLOCATION_TYPE_PINNED */
	props.handleTypes = 0;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = (int)ord;
	CUmemoryPool pool = NULL;
	res_i64(r, "dev", ord);
	r->rc = f(&pool, &props);
	if (r->rc == 0) {
		struct obj *o = store(r, name, K_POOL);
		if (o)
			o->h = pool;
	}
	return 0;
}

/* POOL is a pool's name, or "default" (the current device's default pool). */
static int find_pool(struct result *r, const char *name, CUmemoryPool *pool)
{
	if (strcmp(name, "default") == 0) {
		fn_ctx_get_device getdev = (fn_ctx_get_device)resolve(F_CTX_GET_DEVICE);
		fn_default_pool getpool = (fn_default_pool)resolve(F_DEFAULT_POOL);
		CUdevice dev = 0;
		if (!getdev || !getpool) {
			r->rc = CUDA_ERROR_NOT_FOUND;
			res_str(r, "detail", resolve_error);
			return 1;
		}
		if ((r->rc = getdev(&dev)) != 0 || (r->rc = getpool(pool, dev)) != 0)
			return 1;
		return 0;
	}
	struct obj *o = obj_find(name);
	if (!o || o->kind != K_POOL) {
		usage_error(r->op, "CUDRIVE_NO_SUCH_NAME", "no pool named \"%s\"", name);
		return -1;
	}
	*pool = (CUmemoryPool)o->h;
	return 0;
}

static int cmd_poolalloc(struct stream *s, struct result *r)
{
	char name[NAME_LEN];
	ARG(pname, "POOL");
	SIZE_ARG(size, "SIZE");
	if (new_name(s, r, name, "a") < 0)
		return -1;
	NEED(f, fn_mem_pool_async, F_MEM_ALLOC_FROM_POOL_ASYNC);
	CUmemoryPool pool;
	int k = find_pool(r, pname, &pool);
	if (k)
		return k < 0 ? -1 : 0;
	CUdeviceptr p = 0;
	CUstream st = NULL;
	res_u64(r, "size", size);
	res_str(r, "stream", capturing_stream(&st) ? "capture" : "null");
	r->rc = f(&p, (size_t)size, pool, st);
	if (r->rc == 0) {
		struct obj *o = store(r, name, K_ASYNC);
		if (o) {
			o->ptr = p;
			o->size = size;
		}
		res_u64(r, "ptr", p);
	}
	return 0;
}

static int cmd_poolattr(struct stream *s, struct result *r)
{
	ARG(pname, "POOL");
	NEED(f, fn_pool_attr, F_POOL_GET_ATTR);
	CUmemoryPool pool;
	int k = find_pool(r, pname, &pool);
	if (k)
		return k < 0 ? -1 : 0;
	cuuint64_t reserved = 0, used = 0, reserved_high = 0, used_high = 0;
	if ((r->rc = f(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved)) != 0)
		return 0;
	if ((r->rc = f(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used)) != 0)
		return 0;
	res_u64(r, "reserved", reserved);
	res_u64(r, "used", used);
	if (f(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &reserved_high) == 0)
		res_u64(r, "reserved_high", reserved_high);
	if (f(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &used_high) == 0)
		res_u64(r, "used_high", used_high);
	return 0;
}

static int cmd_pooltrim(struct stream *s, struct result *r)
{
	ARG(pname, "POOL");
	SIZE_ARG(keep, "BYTES");
	NEED(f, fn_pool_trim, F_POOL_TRIM);
	CUmemoryPool pool;
	int k = find_pool(r, pname, &pool);
	if (k)
		return k < 0 ? -1 : 0;
	r->rc = f(pool, (size_t)keep);
	return 0;
}

static CUresult destroy_obj(struct result *r, struct obj *o);

static int cmd_pooldestroy(struct stream *s, struct result *r)
{
	ARG(pname, "POOL");
	struct obj *o = obj_find(pname);
	if (!o || o->kind != K_POOL) {
		usage_error(r->op, "CUDRIVE_NO_SUCH_NAME", "no pool named \"%s\"", pname);
		return -1;
	}
	r->rc = destroy_obj(r, o);
	return 0;
}

static int cmd_memcreate(struct stream *s, struct result *r)
{
	char name[NAME_LEN];
	SIZE_ARG(size, "SIZE");
	ARG(where, "DEV|host");
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = 1; /* CU_MEM_ALLOCATION_TYPE_PINNED */
	if (strcmp(where, "host") == 0) {
		prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
		prop.location.id = 0;
	} else {
		long long ord;
		if (!parse_int(where, &ord)) {
			usage_error(r->op, "CUDRIVE_USAGE", "bad DEV|host: \"%s\"", where);
			return -1;
		}
		prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		prop.location.id = (int)ord;
	}
	if (new_name(s, r, name, "a") < 0)
		return -1;
	NEED(f, fn_mem_create, F_MEM_CREATE);
	CUmemGenericAllocationHandle h = 0;
	res_u64(r, "size", size);
	res_str(r, "location", where);
	r->rc = f(&h, (size_t)size, &prop, 0);
	if (r->rc == 0) {
		struct obj *o = store(r, name, K_HANDLE);
		if (o) {
			o->handle = h;
			o->size = size;
		}
		res_u64(r, "handle", h);
	}
	return 0;
}

static int array_args(struct stream *s, struct result *r, int dims, CUDA_ARRAY3D_DESCRIPTOR *d,
		      unsigned long long *raw)
{
	unsigned long long depth = 0, height;
	CUarray_format fmt;
	unsigned elem;
	SIZE_ARG(width, "W");
	{
		SIZE_ARG(h, "H");
		height = h;
	}
	if (dims == 3) {
		SIZE_ARG(dd, "D");
		depth = dd;
	}
	ARG(fmt_s, "FMT");
	if (!parse_format(fmt_s, &fmt, &elem)) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad FMT \"%s\" (u8 u16 u32 i8 i16 i32 f16 f32)", fmt_s);
		return -1;
	}
	INT_ARG(channels, "CH");
	memset(d, 0, sizeof(*d));
	d->Width = (size_t)width;
	d->Height = (size_t)height;
	d->Depth = (size_t)depth;
	d->Format = fmt;
	d->NumChannels = (unsigned int)channels;
	*raw = width * (height ? height : 1) * (depth ? depth : 1) * (unsigned long long)channels * elem;
	return 0;
}

static int cmd_array(struct stream *s, struct result *r)
{
	char name[NAME_LEN];
	CUDA_ARRAY3D_DESCRIPTOR d3;
	unsigned long long raw;
	if (array_args(s, r, 2, &d3, &raw) < 0)
		return -1;
	if (new_name(s, r, name, "a") < 0)
		return -1;
	NEED(f, fn_array_create, F_ARRAY_CREATE);
	CUDA_ARRAY_DESCRIPTOR d = {d3.Width, d3.Height, d3.Format, d3.NumChannels};
	CUarray a = NULL;
	res_u64(r, "raw_bytes", raw);
	r->rc = f(&a, &d);
	if (r->rc == 0) {
		struct obj *o = store(r, name, K_ARRAY);
		if (o) {
			o->h = a;
			o->size = raw;
		}
	}
	return 0;
}

static int cmd_array3d(struct stream *s, struct result *r)
{
	char name[NAME_LEN];
	CUDA_ARRAY3D_DESCRIPTOR d;
	unsigned long long raw;
	if (array_args(s, r, 3, &d, &raw) < 0)
		return -1;
	if (new_name(s, r, name, "a") < 0)
		return -1;
	NEED(f, fn_array3d_create, F_ARRAY3D_CREATE);
	CUarray a = NULL;
	res_u64(r, "raw_bytes", raw);
	r->rc = f(&a, &d);
	if (r->rc == 0) {
		struct obj *o = store(r, name, K_ARRAY);
		if (o) {
			o->h = a;
			o->size = raw;
		}
	}
	return 0;
}

static int cmd_mipmap(struct stream *s, struct result *r)
{
	char name[NAME_LEN];
	CUDA_ARRAY3D_DESCRIPTOR d;
	unsigned long long raw;
	if (array_args(s, r, 3, &d, &raw) < 0)
		return -1;
	INT_ARG(levels, "LEVELS");
	if (new_name(s, r, name, "a") < 0)
		return -1;
	NEED(f, fn_mipmap_create, F_MIPMAP_CREATE);
	CUmipmappedArray m = NULL;
	res_u64(r, "raw_bytes", raw); /* level 0 only */
	r->rc = f(&m, &d, (unsigned int)levels);
	if (r->rc == 0) {
		struct obj *o = store(r, name, K_MIPMAP);
		if (o) {
			o->h = m;
			o->size = raw;
		}
	}
	return 0;
}

static CUresult destroy_cuvid(struct result *r, struct obj *o);

/* The matching free for the object's kind; the object is forgotten on success. */
static CUresult destroy_vm(struct result *r, struct obj *o);

static CUresult destroy_obj(struct result *r, struct obj *o)
{
	CUresult rc;
	void *f = NULL;
	enum fn_id id;
	if (o->kind == K_DECODER || o->kind == K_PARSER)
		return destroy_cuvid(r, o);
	if (o->kind == K_RANGE || o->kind == K_VMEM)
		return destroy_vm(r, o);
	switch (o->kind) {
	case K_MEM: id = F_MEM_FREE; break;
	case K_ASYNC: id = F_MEM_FREE_ASYNC; break;
	case K_ARRAY: id = F_ARRAY_DESTROY; break;
	case K_MIPMAP: id = F_MIPMAP_DESTROY; break;
	case K_HANDLE: id = F_MEM_RELEASE; break;
	case K_POOL: id = F_POOL_DESTROY; break;
	case K_CTX: id = F_CTX_DESTROY; break;
	case K_STREAM: id = F_STREAM_DESTROY; break;
	default: return CUDA_ERROR_INVALID_VALUE;
	}
	f = resolve(id);
	if (!f) {
		res_str(r, "detail", resolve_error);
		return CUDA_ERROR_NOT_FOUND;
	}
	CUstream st = NULL;
	if (o->kind == K_ASYNC)
		capturing_stream(&st);
	switch (o->kind) {
	case K_MEM: rc = ((fn_mem_free)f)(o->ptr); break;
	case K_ASYNC: rc = ((fn_mem_free_async)f)(o->ptr, st); break;
	case K_ARRAY: rc = ((fn_array_destroy)f)((CUarray)o->h); break;
	case K_MIPMAP: rc = ((fn_mipmap_destroy)f)((CUmipmappedArray)o->h); break;
	case K_HANDLE: rc = ((fn_mem_release)f)(o->handle); break;
	case K_POOL: rc = ((fn_pool_destroy)f)((CUmemoryPool)o->h); break;
	case K_CTX: rc = ((fn_ctx_destroy)f)((CUcontext)o->h); break;
	case K_STREAM: rc = ((fn_stream)f)((CUstream)o->h); break;
	default: rc = CUDA_ERROR_INVALID_VALUE; break;
	}
	if (rc == 0)
		obj_remove(o);
	return rc;
}

static int cmd_free(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	struct obj *o = obj_find(name);
	if (!o) {
		usage_error(r->op, "CUDRIVE_NO_SUCH_NAME", "nothing named \"%s\"", name);
		return -1;
	}
	res_str(r, "name", name);
	res_str(r, "kind", kind_name[o->kind]);
	res_u64(r, "size", o->size);
	CUstream st;
	if (o->kind == K_ASYNC)
		res_str(r, "stream", capturing_stream(&st) ? "capture" : "null");
	r->rc = destroy_obj(r, o);
	return 0;
}

/* cuMemFreeAsync of any memory object (the capture stream while capturing:
 * a free node, of memory allocated before the capture too). */
static int cmd_freeasync(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	struct obj *o = obj_find(name);
	if (!o || (o->kind != K_MEM && o->kind != K_ASYNC)) {
		usage_error(r->op, "CUDRIVE_NO_SUCH_NAME", "no memory named \"%s\"", name);
		return -1;
	}
	NEED(f, fn_mem_free_async, F_MEM_FREE_ASYNC);
	CUstream st = NULL;
	res_str(r, "name", name);
	res_u64(r, "size", o->size);
	res_str(r, "stream", capturing_stream(&st) ? "capture" : "null");
	r->rc = f(o->ptr, st);
	if (r->rc == 0)
		obj_remove(o);
	return 0;
}

static int cmd_ctxdestroy(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	struct obj *o = obj_find(name);
	if (!o || o->kind != K_CTX) {
		usage_error(r->op, "CUDRIVE_NO_SUCH_NAME", "no context named \"%s\"", name);
		return -1;
	}
	res_str(r, "name", name);
	r->rc = destroy_obj(r, o);
	return 0;
}

static int cmd_freeraw(struct stream *s, struct result *r)
{
	ARG(ptr_s, "PTR");
	unsigned long long p;
	if (!parse_u64(ptr_s, &p)) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad PTR: \"%s\"", ptr_s);
		return -1;
	}
	NEED(f, fn_mem_free, F_MEM_FREE);
	res_u64(r, "ptr", p);
	r->rc = f((CUdeviceptr)p);
	/* If it was one of ours, forget it: it is gone either way. */
	for (size_t i = 0; r->rc == 0 && i < nobjs; i++) {
		if (objs[i].kind == K_MEM && objs[i].ptr == p) {
			res_str(r, "name", objs[i].name);
			obj_remove(&objs[i]);
			break;
		}
	}
	return 0;
}

/* Free every memory object, newest first; pools, contexts, streams, decoders and parsers stay. */
static int cmd_freeall(struct stream *s, struct result *r)
{
	unsigned long long freed = 0, failed = 0, bytes = 0;
	size_t i = nobjs;
	while (i-- > 0) {
		struct obj *o = &objs[i];
		if (o->kind == K_POOL || o->kind == K_CTX || o->kind == K_DECODER || o->kind == K_PARSER ||
		    o->kind == K_STREAM)
			continue;
		unsigned long long size = o->size;
		CUresult rc = destroy_obj(r, o);
		if (rc == 0) {
			freed++;
			bytes += size;
		} else {
			failed++;
			if (r->rc == 0)
				r->rc = rc;
		}
	}
	res_u64(r, "freed", freed);
	res_u64(r, "failed", failed);
	res_u64(r, "bytes", bytes);
	return 0;
}

static int cmd_meminfo(struct stream *s, struct result *r)
{
	NEED(f, fn_mem_info, F_MEM_GET_INFO);
	size_t free_b = 0, total = 0;
	r->rc = f(&free_b, &total);
	if (r->rc == 0) {
		res_u64(r, "free", free_b);
		res_u64(r, "total", total);
	}
	return 0;
}

static int cmd_totalmem(struct stream *s, struct result *r)
{
	INT_ARG(ord, "DEV");
	NEED(f, fn_total_mem, F_DEVICE_TOTAL_MEM);
	CUdevice dev;
	size_t total = 0;
	res_i64(r, "dev", ord);
	if ((r->rc = device_get(r, ord, &dev)) != 0)
		return 0;
	r->rc = f(&total, dev);
	if (r->rc == 0)
		res_u64(r, "total", total);
	return 0;
}

static int cmd_uuid(struct stream *s, struct result *r)
{
	INT_ARG(ord, "DEV");
	NEED(f, fn_device_uuid, F_DEVICE_GET_UUID);
	CUdevice dev;
	CUuuid u;
	res_i64(r, "dev", ord);
	if ((r->rc = device_get(r, ord, &dev)) != 0)
		return 0;
	memset(&u, 0, sizeof(u));
	r->rc = f(&u, dev);
	if (r->rc == 0) {
		const unsigned char *b = (const unsigned char *)u.bytes;
		char text[64];
		snprintf(text, sizeof(text),
			 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
			 b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
		res_str(r, "uuid", text);
	}
	return 0;
}

static int cmd_sync(struct stream *s, struct result *r)
{
	NEED(f, fn_void, F_CTX_SYNCHRONIZE);
	r->rc = f();
	return 0;
}

static int cmd_fill(struct stream *s, struct result *r)
{
	SIZE_ARG(size, "SIZE");
	NEED(f, fn_mem_alloc, F_MEM_ALLOC);
	unsigned long long count = 0, bytes = 0;
	CUresult last = CUDA_SUCCESS;
	char name[NAME_LEN], lastname[64];
	/* Bounded so that a driver without a limit cannot keep it busy forever. */
	while (count < 1000000) {
		CUdeviceptr p = 0;
		last = f(&p, (size_t)size);
		if (last != 0)
			break;
		do
			snprintf(name, sizeof(name), "f%lu", fill_counter++);
		while (obj_find(name));
		struct obj *o = obj_add(name, K_MEM);
		if (!o) {
			fn_mem_free release = (fn_mem_free)resolve(F_MEM_FREE);
			if (release)
				release(p);
			break;
		}
		o->ptr = p;
		o->size = size;
		count++;
		bytes += size;
	}
	res_u64(r, "size", size);
	res_u64(r, "count", count);
	res_u64(r, "bytes", bytes);
	res_i64(r, "last_rc", last);
	code_name(lastname, sizeof(lastname), last, false);
	res_str(r, "last_err", lastname);
	return 0;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define RACE_LIVE 32

/* One random alloc/free mix, with its own random stream: race and threads. */
struct race {
	fn_mem_alloc alloc;
	fn_mem_free release;
	fn_ctx_set set_current; /* threads: adopt the caller's context first */
	CUcontext ctx;
	unsigned long long iterations, maxsize;
	uint64_t deadline_ns; /* CLOCK_MONOTONIC; 0: iterations only */
	uint64_t rng;
	unsigned long long done, ok, oom, freed, other, free_failed; /* done: iterations run */
	int first_other;
};

static uint64_t race_next(struct race *t)
{
	/* xorshift64* */
	uint64_t x = t->rng;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	t->rng = x;
	return x * 0x2545F4914F6CDD1Dull;
}

static void *race_run(void *arg)
{
	struct race *t = arg;
	CUdeviceptr live[RACE_LIVE];
	int nlive = 0;
	if (t->set_current && t->set_current(t->ctx) != 0) {
		t->other++;
		return NULL;
	}
	for (t->done = 0; t->done < t->iterations; t->done++) {
		unsigned long long i = t->done;
		/* the clock only every 256 iterations: it is not free under TSan */
		if (t->deadline_ns && (i & 255) == 0 && now_ns() >= t->deadline_ns)
			break;
		uint64_t x = race_next(t);
		bool do_alloc = nlive == 0 || (nlive < RACE_LIVE && (x & 1));
		if (do_alloc) {
			size_t size = (size_t)(1 + (x >> 1) % t->maxsize);
			CUdeviceptr p = 0;
			CUresult rc = t->alloc(&p, size);
			if (rc == 0) {
				live[nlive++] = p;
				t->ok++;
			} else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
				t->oom++;
			} else {
				t->other++;
				if (!t->first_other)
					t->first_other = rc;
			}
		} else {
			int k = (int)((x >> 1) % (uint64_t)nlive);
			if (t->release(live[k]) == 0)
				t->freed++;
			else
				t->free_failed++;
			live[k] = live[--nlive];
		}
	}
	while (nlive > 0) {
		if (t->release(live[--nlive]) == 0)
			t->freed++;
		else
			t->free_failed++;
	}
	return NULL;
}

static void race_report(struct result *r, const struct race *t, int n)
{
	struct race sum = { .iterations = 0 };
	for (int i = 0; i < n; i++) {
		sum.iterations += t[i].done;
		sum.ok += t[i].ok;
		sum.oom += t[i].oom;
		sum.freed += t[i].freed;
		sum.other += t[i].other;
		sum.free_failed += t[i].free_failed;
		if (!sum.first_other)
			sum.first_other = t[i].first_other;
	}
	res_u64(r, "iterations", sum.iterations);
	res_u64(r, "ok", sum.ok);
	res_u64(r, "oom", sum.oom);
	res_u64(r, "freed", sum.freed);
	res_u64(r, "other", sum.other);
	res_i64(r, "first_other_rc", sum.first_other);
	res_u64(r, "free_failed", sum.free_failed);
}

static int cmd_race(struct stream *s, struct result *r)
{
	SIZE_ARG(iterations, "ITERATIONS");
	SIZE_ARG(maxsize, "MAXSIZE");
	SIZE_ARG(seed, "SEED");
	if (maxsize == 0) {
		usage_error(r->op, "CUDRIVE_USAGE", "MAXSIZE must be > 0");
		return -1;
	}
	uint64_t deadline = 0;
	const char *secs_s = opt_arg(s);
	if (secs_s) {
		double secs;
		if (!parse_seconds(secs_s, &secs) || secs == 0) {
			usage_error(r->op, "CUDRIVE_USAGE", "bad SECONDS: \"%s\" (above 0, at most 86400)", secs_s);
			return -1;
		}
		deadline = now_ns() + (uint64_t)(secs * 1e9);
	}
	NEED(alloc, fn_mem_alloc, F_MEM_ALLOC);
	NEED(release, fn_mem_free, F_MEM_FREE);
	struct race t = { .alloc = alloc, .release = release, .iterations = iterations, .maxsize = maxsize,
			  .deadline_ns = deadline, .rng = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull };
	if (!t.rng)
		t.rng = 1;
	race_run(&t);
	race_report(r, &t, 1);
	return 0;
}

static int cmd_churn(struct stream *s, struct result *r)
{
	SIZE_ARG(size, "SIZE");
	ARG(secs_s, "SECONDS");
	double secs;
	if (size == 0 || !parse_seconds(secs_s, &secs) || secs == 0) {
		usage_error(r->op, "CUDRIVE_USAGE", "churn SIZE SECONDS: SIZE above 0, SECONDS above 0 "
			    "and at most 86400");
		return -1;
	}
	NEED(alloc, fn_mem_alloc, F_MEM_ALLOC);
	NEED(release, fn_mem_free, F_MEM_FREE);
	unsigned long long loops = 0, ok = 0, oom = 0, other = 0;
	uint64_t began = now_ns(), deadline = began + (uint64_t)(secs * 1e9);
	while ((loops & 255) != 0 || now_ns() < deadline) {
		CUdeviceptr p = 0;
		CUresult rc = alloc(&p, (size_t)size);
		loops++;
		if (rc == CUDA_SUCCESS) {
			ok++;
			if (release(p) != CUDA_SUCCESS)
				other++;
		} else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
			oom++;
		} else {
			other++;
		}
	}
	res_u64(r, "loops", loops);
	res_u64(r, "ok", ok);
	res_u64(r, "oom", oom);
	res_u64(r, "other", other);
	res_u64(r, "elapsed_ns", now_ns() - began);
	return 0;
}

/* threads N ITERATIONS MAXSIZE SEED: N threads of this process run the race mix at once. */
static int cmd_threads(struct stream *s, struct result *r)
{
	SIZE_ARG(n, "N");
	SIZE_ARG(iterations, "ITERATIONS");
	SIZE_ARG(maxsize, "MAXSIZE");
	SIZE_ARG(seed, "SEED");
	if (maxsize == 0 || n == 0 || n > 64) {
		usage_error(r->op, "CUDRIVE_USAGE", "N must be 1..64 and MAXSIZE > 0");
		return -1;
	}
	NEED(alloc, fn_mem_alloc, F_MEM_ALLOC);
	NEED(release, fn_mem_free, F_MEM_FREE);
	NEED(set_current, fn_ctx_set, F_CTX_SET_CURRENT);
	NEED(get_current, fn_ctx_get_current, F_CTX_GET_CURRENT);
	CUcontext ctx = NULL;
	get_current(&ctx);
	struct race t[64];
	pthread_t tid[64];
	for (unsigned long long i = 0; i < n; i++) {
		t[i] = (struct race){ .alloc = alloc, .release = release, .set_current = set_current, .ctx = ctx,
				      .iterations = iterations, .maxsize = maxsize,
				      .rng = (seed + i + 1) * 0x9E3779B97F4A7C15ull };
		if (pthread_create(&tid[i], NULL, race_run, &t[i]) != 0) {
			n = i;
			r->rc = -1;
			res_str(r, "err", "CUDRIVE_THREAD");
			break;
		}
	}
	for (unsigned long long i = 0; i < n; i++)
		pthread_join(tid[i], NULL);
	race_report(r, t, (int)n);
	return 0;
}

/*
 * A driver (or a preload library) that dereferences a NULL output pointer
 * crashes; `null` reports that as {"rc":-1,"err":"CUDRIVE_CRASH","signal":N}
 * and goes on, so the caller sees which call crashed.
 */
static sigjmp_buf null_jump;
static volatile sig_atomic_t null_signal;

static void null_crash(int sig)
{
	null_signal = sig;
	siglongjmp(null_jump, 1);
}

static int null_call(struct stream *s, struct result *r);

static int cmd_null(struct stream *s, struct result *r)
{
	struct sigaction sa, old_segv, old_bus;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = null_crash;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_NODEFER;
	sigaction(SIGSEGV, &sa, &old_segv);
	sigaction(SIGBUS, &sa, &old_bus);
	int k;
	null_signal = 0;
	if (sigsetjmp(null_jump, 1) == 0) {
		k = null_call(s, r);
	} else {
		r->rc = RC_USAGE;
		r->err = "CUDRIVE_CRASH";
		res_i64(r, "signal", null_signal);
		k = 0;
	}
	sigaction(SIGSEGV, &old_segv, NULL);
	sigaction(SIGBUS, &old_bus, NULL);
	return k;
}

/* Each API with a NULL output pointer: the answer must be an error, never a crash. */
static int null_call(struct stream *s, struct result *r)
{
	ARG(what, "WHAT");
	res_str(r, "what", what);
	if (strcmp(what, "alloc") == 0) {
		NEED(f, fn_mem_alloc, F_MEM_ALLOC);
		r->rc = f(NULL, 1 << 20);
	} else if (strcmp(what, "pitch") == 0) {
		NEED(f, fn_mem_pitch, F_MEM_ALLOC_PITCH);
		size_t pitch = 0;
		CUdeviceptr p = 0;
		r->rc = f(NULL, &pitch, 1024, 1024, 4);
		res_i64(r, "rc_null_pitch", f(&p, NULL, 1024, 1024, 4));
		res_u64(r, "ptr_null_pitch", p);
	} else if (strcmp(what, "managed") == 0) {
		NEED(f, fn_mem_managed, F_MEM_ALLOC_MANAGED);
		r->rc = f(NULL, 1 << 20, CU_MEM_ATTACH_GLOBAL);
	} else if (strcmp(what, "async") == 0) {
		NEED(f, fn_mem_async, F_MEM_ALLOC_ASYNC);
		r->rc = f(NULL, 1 << 20, NULL);
	} else if (strcmp(what, "poolalloc") == 0) {
		NEED(f, fn_mem_pool_async, F_MEM_ALLOC_FROM_POOL_ASYNC);
		CUmemoryPool pool;
		int k = find_pool(r, "default", &pool);
		if (k)
			return k < 0 ? -1 : 0;
		r->rc = f(NULL, 1 << 20, pool, NULL);
	} else if (strcmp(what, "meminfo") == 0) {
		NEED(f, fn_mem_info, F_MEM_GET_INFO);
		size_t v = 0;
		r->rc = f(NULL, NULL);
		res_i64(r, "rc_free_null", f(NULL, &v));
		res_i64(r, "rc_total_null", f(&v, NULL));
	} else if (strcmp(what, "totalmem") == 0) {
		NEED(f, fn_total_mem, F_DEVICE_TOTAL_MEM);
		CUdevice dev = 0;
		if ((r->rc = device_get(r, 0, &dev)) != 0)
			return 0;
		r->rc = f(NULL, dev);
	} else if (strcmp(what, "memcreate") == 0) {
		NEED(f, fn_mem_create, F_MEM_CREATE);
		CUmemAllocationProp prop;
		CUmemGenericAllocationHandle h = 0;
		memset(&prop, 0, sizeof(prop));
		prop.type = 1;
		prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		prop.location.id = 0;
		r->rc = f(NULL, 2 << 20, &prop, 0);
		res_i64(r, "rc_null_prop", f(&h, 2 << 20, NULL, 0));
	} else if (strcmp(what, "array") == 0) {
		NEED(f, fn_array_create, F_ARRAY_CREATE);
		CUDA_ARRAY_DESCRIPTOR d = {64, 64, CU_AD_FORMAT_FLOAT, 1};
		CUarray a = NULL;
		r->rc = f(NULL, &d);
		res_i64(r, "rc_null_desc", f(&a, NULL));
	} else if (strcmp(what, "array3d") == 0) {
		NEED(f, fn_array3d_create, F_ARRAY3D_CREATE);
		CUDA_ARRAY3D_DESCRIPTOR d = {64, 64, 4, CU_AD_FORMAT_FLOAT, 1, 0};
		CUarray a = NULL;
		r->rc = f(NULL, &d);
		res_i64(r, "rc_null_desc", f(&a, NULL));
	} else if (strcmp(what, "mipmap") == 0) {
		NEED(f, fn_mipmap_create, F_MIPMAP_CREATE);
		CUDA_ARRAY3D_DESCRIPTOR d = {64, 64, 0, CU_AD_FORMAT_FLOAT, 1, 0};
		CUmipmappedArray m = NULL;
		r->rc = f(NULL, &d, 3);
		res_i64(r, "rc_null_desc", f(&m, NULL, 3));
	} else if (strcmp(what, "getproc") == 0) {
		CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
		r->rc = get_proc(false, "cuMemAlloc", NULL, proc_version, proc_flags, &st);
		res_i64(r, "rc_v1", get_proc(true, "cuMemAlloc", NULL, proc_version, proc_flags, NULL));
	} else if (strcmp(what, "cuvidcaps") == 0) {
		NEED_CUVID(f, fn_cuvid_caps, "cuvidGetDecoderCaps");
		r->rc = f(NULL);
	} else if (strcmp(what, "decoder") == 0) {
		NEED_CUVID(f, fn_cuvid_create, "cuvidCreateDecoder");
		CUVIDDECODECREATEINFO ci;
		CUvideodecoder dec = NULL;
		memset(&ci, 0, sizeof(ci));
		ci.ulWidth = ci.ulHeight = ci.ulMaxWidth = ci.ulMaxHeight = ci.ulTargetWidth = ci.ulTargetHeight = 256;
		ci.ulNumDecodeSurfaces = 4;
		ci.ulNumOutputSurfaces = 1;
		ci.CodecType = cudaVideoCodec_H264;
		ci.ChromaFormat = cudaVideoChromaFormat_420;
		r->rc = f(NULL, &ci);
		res_i64(r, "rc_null_info", f(&dec, NULL));
	} else if (strcmp(what, "nvmlmem") == 0) {
		r->nvml = true;
		NEED_NVML(gethandle, fn_nvml_handle, "nvmlDeviceGetHandleByIndex_v2");
		NEED_NVML(mem, fn_nvml_mem, "nvmlDeviceGetMemoryInfo");
		NEED_NVML(mem2, fn_nvml_mem2, "nvmlDeviceGetMemoryInfo_v2");
		nvmlDevice_t dev = NULL;
		if ((r->rc = gethandle(0, &dev)) != 0)
			return 0;
		r->rc = mem(dev, NULL);
		res_i64(r, "rc_v2", mem2(dev, NULL));
	} else {
		usage_error(r->op, "CUDRIVE_USAGE", "unknown null target \"%s\"", what);
		return -1;
	}
	return 0;
}

/* Where a resolved pointer lives: the file and symbol dladdr names. */
static void describe_ptr(struct result *r, void *p)
{
	Dl_info info;
	res_hex(r, "ptr", p);
	if (p && dladdr(p, &info)) {
		res_str(r, "lib", info.dli_fname ? info.dli_fname : "");
		res_str(r, "sym", info.dli_sname ? info.dli_sname : "");
	}
}

static int cmd_getproc_common(struct stream *s, struct result *r, bool v1)
{
	ARG(base, "BASENAME");
	INT_ARG(version, "VERSION");
	SIZE_ARG(flags, "FLAGS");
	void *p = NULL;
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
	res_str(r, "symbol", base);
	r->rc = get_proc(v1, base, &p, (int)version, flags, &st);
	if (getproc_missing)
		res_str(r, "detail", resolve_error);
	describe_ptr(r, p);
	if (!v1)
		res_i64(r, "status", st);
	return 0;
}

static int cmd_getproc(struct stream *s, struct result *r)
{
	return cmd_getproc_common(s, r, false);
}

static int cmd_getproc1(struct stream *s, struct result *r)
{
	return cmd_getproc_common(s, r, true);
}

static int cmd_dlsym(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	res_str(r, "symbol", name);
	void *p = cuda_dlsym(name);
	if (!p) {
		r->rc = CUDA_ERROR_NOT_FOUND;
		res_str(r, "detail", resolve_error);
	}
	describe_ptr(r, p);
	return 0;
}

static int cmd_nvmldlsym(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	r->nvml = true;
	res_str(r, "symbol", name);
	void *p = nvml_dlsym(name);
	if (!p) {
		r->rc = NVML_ERROR_FUNCTION_NOT_FOUND;
		res_str(r, "detail", resolve_error);
	}
	describe_ptr(r, p);
	return 0;
}

static int cmd_resolve(struct stream *s, struct result *r)
{
	ARG(how, "dlsym|next|default|procaddr|procaddr1");
	enum resolve_mode m;
	if (strcmp(how, "dlsym") == 0)
		m = RESOLVE_DLSYM;
	else if (strcmp(how, "next") == 0)
		m = RESOLVE_NEXT;
	else if (strcmp(how, "default") == 0)
		m = RESOLVE_DEFAULT;
	else if (strcmp(how, "procaddr") == 0)
		m = RESOLVE_PROCADDR;
	else if (strcmp(how, "procaddr1") == 0)
		m = RESOLVE_PROCADDR1;
	else {
		usage_error(r->op, "CUDRIVE_USAGE", "bad mode \"%s\" (dlsym, next, default, procaddr, procaddr1)", how);
		return -1;
	}
	long long version = 12000;
	unsigned long long flags = 0;
	const char *v = opt_arg(s);
	if (v) {
		if (!parse_int(v, &version)) {
			usage_error(r->op, "CUDRIVE_USAGE", "bad VERSION: \"%s\"", v);
			return -1;
		}
		const char *fl = opt_arg(s);
		if (fl && !parse_u64(fl, &flags)) {
			usage_error(r->op, "CUDRIVE_USAGE", "bad FLAGS: \"%s\"", fl);
			return -1;
		}
	}
	mode = m;
	proc_version = (int)version;
	proc_flags = flags;
	memset(fn_cached, 0, sizeof(fn_cached));
	memset(fn_cache, 0, sizeof(fn_cache));
	res_str(r, "mode", how);
	res_i64(r, "version", proc_version);
	res_u64(r, "flags", proc_flags);
	return 0;
}

/* ---- kernels, events, capture and graphs ---------------------------------------- */

/* An empty kernel of the busy kernel's name and signature, for a real GPU:
 * there it returns at once (the simulated GPU accepts any image). */
static const char busy_ptx[] = ".version 7.0\n"
			       ".target sm_70\n"
			       ".address_size 64\n"
			       ".visible .entry hami_sim_busy(.param .u64 p)\n"
			       "{\n"
			       "\tret;\n"
			       "}\n";

/* The busy kernel, and the context it was loaded in. */
static struct {
	bool loaded;
	CUcontext ctx;
	CUmodule mod;
	CUfunction fn;
} busy;

/* cudrive's stream for capture (and graph launches), and the context it was
 * made in. kernels: launches cudrive put into the capture under way. */
static struct {
	bool made, capturing;
	CUcontext ctx;
	CUstream s;
	unsigned long long kernels;
} cap;

#define MAX_GRAPHS 64
#define BURN_GRAPH_KERNELS 8

/* Graphs captured by `capture end`, by name; exec once `graph` instantiated it. */
static struct graph_entry {
	char name[NAME_LEN];
	CUgraph g;
	CUgraphExec exec;
	unsigned long long kernels;
} graphs[MAX_GRAPHS];
static int ngraphs;
static unsigned long graph_counter;

enum launch_kind { L_KERNEL, L_EX, L_COOP, L_GRAPH };

static const struct {
	const char *word;
	enum launch_kind kind;
	enum fn_id fn;
} launch_kinds[] = {
	{"launch", L_KERNEL, F_LAUNCH_KERNEL},
	{"launchex", L_EX, F_LAUNCH_KERNEL_EX},
	{"coop", L_COOP, F_LAUNCH_COOPERATIVE},
	{"graph", L_GRAPH, F_GRAPH_LAUNCH},
};

/* A handle the driver no longer knows: its context was released and retained
 * again, or destroyed (and a new one may have the same address). The command
 * reports the error; the next one loads or makes a fresh one. */
static bool stale(CUresult rc)
{
	return rc == CUDA_ERROR_INVALID_HANDLE || rc == 709 /* CUDA_ERROR_CONTEXT_IS_DESTROYED */;
}

static void forget_busy(CUresult rc)
{
	if (stale(rc))
		busy.loaded = false;
}

static void forget_stream(CUresult rc)
{
	if (stale(rc)) {
		cap.made = false;
		cap.capturing = false;
		cap.kernels = 0;
	}
}

/* F resolved, or NULL with the reason in r's detail. */
static void *need(struct result *r, enum fn_id id)
{
	void *p = resolve(id);
	if (!p)
		res_str(r, "detail", resolve_error);
	return p;
}

static CUresult current_ctx(struct result *r, CUcontext *ctx)
{
	fn_ctx_get_current f = (fn_ctx_get_current)need(r, F_CTX_GET_CURRENT);
	if (!f)
		return CUDA_ERROR_NOT_FOUND;
	*ctx = NULL;
	CUresult rc = f(ctx);
	if (rc == 0 && !*ctx)
		rc = CUDA_ERROR_INVALID_CONTEXT; /* nothing to load into or launch in */
	return rc;
}

/* Load the busy kernel unless it is loaded in the current context already
 * (FORCE: load it again anyway, dropping the old module of this context).
 * NAME: the kernel `launch` and its kin run from then on (NULL: the busy
 * kernel): the simulated GPU knows kernels by name (hami_sim_local_<size>
 * needs that much local memory). */
static CUresult busy_load_named(struct result *r, bool force, const char *name)
{
	CUcontext cur;
	CUresult rc = current_ctx(r, &cur);
	if (rc)
		return rc;
	if (!force && busy.loaded && busy.ctx == cur)
		return CUDA_SUCCESS;
	fn_module_load load = (fn_module_load)need(r, F_MODULE_LOAD_DATA);
	fn_module_function getfn = (fn_module_function)need(r, F_MODULE_GET_FUNCTION);
	if (!load || !getfn)
		return CUDA_ERROR_NOT_FOUND;
	if (busy.loaded && busy.ctx == cur) {
		fn_module_unload unload = (fn_module_unload)resolve(F_MODULE_UNLOAD);
		if (unload)
			unload(busy.mod);
	}
	busy.loaded = false;
	CUmodule mod = NULL;
	CUfunction fn = NULL;
	if ((rc = load(&mod, busy_ptx)) != 0) {
		res_str(r, "detail", "cuModuleLoadData failed");
		return rc;
	}
	if ((rc = getfn(&fn, mod, name ? name : "hami_sim_busy")) != 0) {
		res_str(r, "detail", "cuModuleGetFunction failed");
		fn_module_unload unload = (fn_module_unload)resolve(F_MODULE_UNLOAD);
		if (unload)
			unload(mod);
		return rc;
	}
	busy.loaded = true;
	busy.ctx = cur;
	busy.mod = mod;
	busy.fn = fn;
	return CUDA_SUCCESS;
}

/* cudrive's capture stream in the current context, made when needed. */
static CUresult cap_stream(struct result *r)
{
	CUcontext cur;
	CUresult rc = current_ctx(r, &cur);
	if (rc)
		return rc;
	if (cap.made && cap.ctx == cur)
		return CUDA_SUCCESS;
	fn_stream_create create = (fn_stream_create)need(r, F_STREAM_CREATE);
	if (!create)
		return CUDA_ERROR_NOT_FOUND;
	CUstream st = NULL;
	/* Non-blocking: work on the legacy stream never waits for it, nor the
	 * other way round, so a capture on it does not trip over either. */
	if ((rc = create(&st, 1)) != 0)
		return rc;
	cap.made = true;
	cap.capturing = false;
	cap.kernels = 0;
	cap.ctx = cur;
	cap.s = st;
	return CUDA_SUCCESS;
}

/* One launch of the busy kernel for *NS ns through FN (of KIND) on S. */
static CUresult launch_busy(enum launch_kind kind, void *fn, unsigned long long *ns, CUstream s)
{
	void *params[1] = {ns};
	switch (kind) {
	case L_KERNEL:
		return ((fn_launch)fn)(busy.fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
	case L_EX: {
		struct launch_config cfg = {1, 1, 1, 1, 1, 1, 0, s, NULL, 0};
		return ((fn_launch_ex)fn)(&cfg, busy.fn, params, NULL);
	}
	case L_COOP:
		return ((fn_launch_coop)fn)(busy.fn, 1, 1, 1, 1, 1, 1, 0, s, params);
	case L_GRAPH:
		break;
	}
	return CUDA_ERROR_INVALID_VALUE;
}

/* An optional COUNT (default 1). */
static int opt_count(struct stream *s, struct result *r, unsigned long long *count)
{
	const char *c = opt_arg(s);
	*count = 1;
	if (c && !parse_u64(c, count)) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad COUNT: \"%s\"", c);
		return -1;
	}
	return 0;
}

static CUresult busy_load(struct result *r, bool force)
{
	return busy_load_named(r, force, NULL);
}

static int cmd_module(struct stream *s, struct result *r)
{
	r->rc = busy_load_named(r, true, opt_arg(s));
	if (r->rc == 0) {
		res_hex(r, "module", busy.mod);
		res_hex(r, "function", busy.fn);
	}
	return 0;
}

/* COUNT launches; rc: the last failure's, or 0; count: the launches that worked. */
static int launch_common(struct stream *s, struct result *r, enum launch_kind kind, enum fn_id id)
{
	U64_ARG(ns, "NS");
	unsigned long long count, ok = 0, failed = 0;
	if (opt_count(s, r, &count) < 0)
		return -1;
	res_u64(r, "ns", ns);
	void *fn = need(r, id);
	if (!fn) {
		r->rc = CUDA_ERROR_NOT_FOUND;
		return 0;
	}
	if ((r->rc = busy_load(r, false)) != 0)
		return 0;
	CUstream st = cap.capturing ? cap.s : NULL;
	res_str(r, "stream", cap.capturing ? "capture" : "null");
	for (unsigned long long i = 0; i < count; i++) {
		CUresult rc = launch_busy(kind, fn, &ns, st);
		if (rc) {
			failed++;
			r->rc = rc;
		} else {
			ok++;
		}
	}
	if (cap.capturing)
		cap.kernels += ok;
	forget_busy(r->rc); /* the stream: the capture commands find out */
	res_u64(r, "count", ok);
	res_u64(r, "failed", failed);
	return 0;
}

static int cmd_launch(struct stream *s, struct result *r)
{
	return launch_common(s, r, L_KERNEL, F_LAUNCH_KERNEL);
}

static int cmd_launchex(struct stream *s, struct result *r)
{
	return launch_common(s, r, L_EX, F_LAUNCH_KERNEL_EX);
}

static int cmd_coop(struct stream *s, struct result *r)
{
	return launch_common(s, r, L_COOP, F_LAUNCH_COOPERATIVE);
}

/* ---- named streams and stream memory operations ------------------------------ */

/* stream [NAME [nonblocking]]: a stream of the current context. */
static int cmd_stream(struct stream *s, struct result *r)
{
	char name[NAME_LEN];
	if (new_name(s, r, name, "s") < 0)
		return -1;
	unsigned int flags = CU_STREAM_DEFAULT;
	const char *f = opt_arg(s);
	if (f && strcmp(f, "nonblocking") != 0) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad flag \"%s\" (nonblocking)", f);
		return -1;
	}
	if (f)
		flags = CU_STREAM_NON_BLOCKING;
	NEED(create, fn_stream_create, F_STREAM_CREATE);
	CUstream st = NULL;
	res_u64(r, "flags", flags);
	if ((r->rc = create(&st, flags)) != 0)
		return 0;
	struct obj *o = store(r, name, K_STREAM);
	if (o)
		o->h = st;
	res_hex(r, "stream", st);
	return 0;
}

/* STREAM: a name from `stream`, or "null" (the legacy default stream). */
static int stream_arg(struct result *r, const char *name, CUstream *st)
{
	res_str(r, "stream", name);
	if (strcmp(name, "null") == 0) {
		*st = NULL;
		return 0;
	}
	struct obj *o = obj_find(name);
	if (!o || o->kind != K_STREAM) {
		usage_error(r->op, "CUDRIVE_NO_SUCH_NAME", "no stream named \"%s\"", name);
		return -1;
	}
	*st = (CUstream)o->h;
	return 0;
}

static int cmd_launchon(struct stream *s, struct result *r)
{
	ARG(name, "STREAM");
	U64_ARG(ns, "NS");
	unsigned long long count, ok = 0, failed = 0;
	CUstream st;
	if (stream_arg(r, name, &st) < 0 || opt_count(s, r, &count) < 0)
		return -1;
	res_u64(r, "ns", ns);
	NEED(fn, void *, F_LAUNCH_KERNEL);
	if ((r->rc = busy_load(r, false)) != 0)
		return 0;
	for (unsigned long long i = 0; i < count; i++) {
		CUresult rc = launch_busy(L_KERNEL, fn, &ns, st);
		if (rc) {
			failed++;
			r->rc = rc;
		} else {
			ok++;
		}
	}
	forget_busy(r->rc);
	res_u64(r, "count", ok);
	res_u64(r, "failed", failed);
	return 0;
}

static int stream_call(struct stream *s, struct result *r, enum fn_id id)
{
	ARG(name, "STREAM");
	CUstream st;
	if (stream_arg(r, name, &st) < 0)
		return -1;
	NEED(f, fn_stream, id);
	uint64_t t0 = now_ns();
	r->rc = f(st);
	res_u64(r, "wait_ns", now_ns() - t0);
	return 0;
}

static int cmd_streamsync(struct stream *s, struct result *r)
{
	return stream_call(s, r, F_STREAM_SYNCHRONIZE);
}

static int cmd_streamquery(struct stream *s, struct result *r)
{
	return stream_call(s, r, F_STREAM_QUERY);
}

/* STREAM MEM VALUE: the stream, the address of MEM's first 32-bit word, the value. */
static int value_args(struct stream *s, struct result *r, CUstream *st, CUdeviceptr *addr, cuuint32_t *value)
{
	ARG(name, "STREAM");
	ARG(mem, "MEM");
	U64_ARG(v, "VALUE");
	if (stream_arg(r, name, st) < 0)
		return -1;
	struct obj *o = obj_find(mem);
	if (!o || (o->kind != K_MEM && o->kind != K_ASYNC) || o->size < sizeof(cuuint32_t)) {
		usage_error(r->op, "CUDRIVE_NO_SUCH_NAME", "no device memory of 4 bytes or more named \"%s\"", mem);
		return -1;
	}
	if (v > 0xffffffffull) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad VALUE (0 to 0xffffffff): %llu", v);
		return -1;
	}
	res_str(r, "mem", mem);
	res_u64(r, "value", v);
	*addr = o->ptr;
	*value = (cuuint32_t)v;
	return 0;
}

static int cmd_waitvalue(struct stream *s, struct result *r)
{
	static const char *const conds[] = {"geq", "eq", "and", "nor"};
	CUstream st;
	CUdeviceptr addr;
	cuuint32_t value;
	if (value_args(s, r, &st, &addr, &value) < 0)
		return -1;
	const char *c = opt_arg(s);
	unsigned int flags = CU_STREAM_WAIT_VALUE_EQ;
	if (c) {
		unsigned int i = 0;
		while (i < 4 && strcmp(conds[i], c) != 0)
			i++;
		if (i == 4) {
			usage_error(r->op, "CUDRIVE_USAGE", "bad condition \"%s\" (geq, eq, and, nor)", c);
			return -1;
		}
		flags = i;
	}
	res_str(r, "condition", conds[flags]);
	NEED(f, fn_stream_value, F_STREAM_WAIT_VALUE);
	r->rc = f(st, addr, value, flags);
	return 0;
}

static int cmd_writevalue(struct stream *s, struct result *r)
{
	CUstream st;
	CUdeviceptr addr;
	cuuint32_t value;
	if (value_args(s, r, &st, &addr, &value) < 0)
		return -1;
	NEED(f, fn_stream_value, F_STREAM_WRITE_VALUE);
	r->rc = f(st, addr, value, CU_STREAM_WRITE_VALUE_DEFAULT);
	return 0;
}

/* ---- alternating contexts ------------------------------------------------------ */

/* alternate CTX_A CTX_B NS COUNT: the way a program that works on two GPUs
 * (or two contexts) from one thread goes back and forth between them. */
static int cmd_alternate(struct stream *s, struct result *r)
{
	ARG(name_a, "CTX_A");
	ARG(name_b, "CTX_B");
	U64_ARG(ns, "NS");
	U64_ARG(count, "COUNT");
	const char *names[2] = {name_a, name_b};
	CUcontext ctx[2];
	for (int i = 0; i < 2; i++) {
		struct obj *o = obj_find(names[i]);
		if (!o || o->kind != K_CTX) {
			usage_error(r->op, "CUDRIVE_NO_SUCH_NAME", "no context named \"%s\"", names[i]);
			return -1;
		}
		ctx[i] = (CUcontext)o->h;
	}
	NEED(set, fn_ctx_set, F_CTX_SET_CURRENT);
	NEED(load, fn_module_load, F_MODULE_LOAD_DATA);
	NEED(getfn, fn_module_function, F_MODULE_GET_FUNCTION);
	NEED(unload, fn_module_unload, F_MODULE_UNLOAD);
	NEED(launch, fn_launch, F_LAUNCH_KERNEL);
	CUmodule mod[2] = {NULL, NULL};
	CUfunction fn[2] = {NULL, NULL};
	res_u64(r, "ns", ns);
	for (int i = 0; i < 2 && r->rc == 0; i++) {
		if ((r->rc = set(ctx[i])) == 0 && (r->rc = load(&mod[i], busy_ptx)) == 0 &&
		    (r->rc = getfn(&fn[i], mod[i], "hami_sim_busy")) != 0)
			res_str(r, "detail", "cuModuleGetFunction failed");
	}
	unsigned long long launches = 0;
	for (unsigned long long i = 0; i < count && r->rc == 0; i++) {
		void *params[1] = {&ns};
		int k = (int)(i % 2);
		if ((r->rc = set(ctx[k])) == 0 && (r->rc = launch(fn[k], 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL)) == 0)
			launches++;
	}
	for (int i = 0; i < 2; i++)
		if (mod[i] && set(ctx[i]) == 0)
			unload(mod[i]);
	res_u64(r, "launches", launches);
	return 0;
}

static bool capturing_stream(CUstream *s)
{
	if (!cap.capturing)
		return false;
	*s = cap.s;
	return true;
}

static const char *const capture_modes[] = {"global", "thread", "relaxed"};

/* A capture mode word: its CUstreamCaptureMode, or -1 (usage error reported). */
static int capture_mode_arg(struct result *r, const char *m)
{
	for (int mode = 0; mode < 3; mode++)
		if (strcmp(capture_modes[mode], m) == 0)
			return mode;
	usage_error(r->op, "CUDRIVE_USAGE", "bad MODE \"%s\" (global, thread, relaxed)", m);
	return -1;
}

static struct graph_entry *graph_find(const char *name)
{
	for (int i = 0; i < ngraphs; i++)
		if (strcmp(graphs[i].name, name) == 0)
			return &graphs[i];
	return NULL;
}

/* capture begin [MODE] | capture end [NAME] | capture status */
static int cmd_capture(struct stream *s, struct result *r)
{
	ARG(what, "begin|end|status");
	res_str(r, "what", what);
	if (strcmp(what, "begin") == 0) {
		int mode = 0;
		const char *m = opt_arg(s);
		if (m && (mode = capture_mode_arg(r, m)) < 0)
			return -1;
		res_str(r, "mode", capture_modes[mode]);
		fn_begin_capture begin = (fn_begin_capture)need(r, F_BEGIN_CAPTURE);
		if (!begin) {
			r->rc = CUDA_ERROR_NOT_FOUND;
			return 0;
		}
		if ((r->rc = cap_stream(r)) != 0)
			return 0;
		r->rc = begin(cap.s, mode);
		if (r->rc == 0) {
			cap.capturing = true;
			cap.kernels = 0;
		}
		forget_stream(r->rc);
		return 0;
	}
	if (strcmp(what, "end") == 0) {
		char name[NAME_LEN];
		const char *given = opt_arg(s);
		if (given) {
			if (strlen(given) >= NAME_LEN || graph_find(given)) {
				usage_error(r->op, graph_find(given) ? "CUDRIVE_NAME_IN_USE" : "CUDRIVE_USAGE",
					    "bad or used graph name: \"%s\"", given);
				return -1;
			}
			snprintf(name, sizeof(name), "%s", given);
		} else {
			do
				snprintf(name, sizeof(name), "g%lu", graph_counter++);
			while (graph_find(name));
		}
		fn_end_capture end = (fn_end_capture)need(r, F_END_CAPTURE);
		if (!end) {
			r->rc = CUDA_ERROR_NOT_FOUND;
			return 0;
		}
		if ((r->rc = cap_stream(r)) != 0)
			return 0;
		CUgraph g = NULL;
		r->rc = end(cap.s, &g);
		unsigned long long kernels = cap.kernels;
		res_u64(r, "kernels", kernels);
		if (r->rc == 908) /* CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: the capture goes on */
			return 0;
		/* The driver ends the capture whatever else it answers (but "not capturing"). */
		cap.capturing = false;
		cap.kernels = 0;
		forget_stream(r->rc);
		if (r->rc != 0)
			return 0;
		if (ngraphs == MAX_GRAPHS) {
			fn_graph_destroy destroy = (fn_graph_destroy)resolve(F_GRAPH_DESTROY);
			if (destroy)
				destroy(g);
			r->rc = RC_USAGE;
			r->err = "CUDRIVE_TOO_MANY_GRAPHS";
			return 0;
		}
		struct graph_entry *e = &graphs[ngraphs++];
		memset(e, 0, sizeof(*e));
		snprintf(e->name, sizeof(e->name), "%s", name);
		e->g = g;
		e->kernels = kernels;
		res_str(r, "name", name);
		return 0;
	}
	if (strcmp(what, "status") == 0) {
		fn_is_capturing is = (fn_is_capturing)need(r, F_IS_CAPTURING);
		if (!is) {
			r->rc = CUDA_ERROR_NOT_FOUND;
			return 0;
		}
		if ((r->rc = cap_stream(r)) != 0)
			return 0;
		int status = -1;
		r->rc = is(cap.s, &status);
		res_i64(r, "status", status);
		forget_stream(r->rc);
		return 0;
	}
	if (strcmp(what, "info") == 0) {
		fn_capture_info info = (fn_capture_info)need(r, F_CAPTURE_INFO);
		if (!info) {
			r->rc = CUDA_ERROR_NOT_FOUND;
			return 0;
		}
		if ((r->rc = cap_stream(r)) != 0)
			return 0;
		int status = -1;
		cuuint64_t id = 0;
		CUgraph g = NULL;
		const void *deps = NULL;
		size_t ndeps = 0;
		r->rc = info(cap.s, &status, &id, &g, &deps, &ndeps);
		res_i64(r, "status", status);
		res_u64(r, "id", id);
		res_hex(r, "graph", g);
		res_u64(r, "dependencies", ndeps);
		forget_stream(r->rc);
		return 0;
	}
	usage_error(r->op, "CUDRIVE_USAGE", "bad capture step \"%s\" (begin, end, status, info)", what);
	return -1;
}

/* capturemode global|thread|relaxed: the calling thread's interaction mode. */
static int cmd_capturemode(struct stream *s, struct result *r)
{
	ARG(m, "global|thread|relaxed");
	int mode = capture_mode_arg(r, m);
	if (mode < 0)
		return -1;
	NEED(f, fn_capture_mode, F_CAPTURE_MODE);
	int x = mode;
	r->rc = f(&x);
	res_str(r, "mode", capture_modes[mode]);
	if (r->rc == 0)
		res_str(r, "previous", x >= 0 && x < 3 ? capture_modes[x] : "unknown");
	return 0;
}

static struct graph_entry *graph_arg(struct result *r, const char *name)
{
	struct graph_entry *e = graph_find(name);
	if (!e)
		usage_error(r->op, "CUDRIVE_NO_SUCH_NAME", "no graph named \"%s\"", name);
	return e;
}

/* Instantiate graph NAME (again: its previous executable is destroyed). */
static int cmd_graph(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	const char *flag = opt_arg(s);
	if (flag && strcmp(flag, "autofree") != 0) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad flag \"%s\" (autofree)", flag);
		return -1;
	}
	struct graph_entry *e = graph_arg(r, name);
	if (!e)
		return -1;
	res_str(r, "name", name);
	res_u64(r, "kernels", e->kernels);
	res_i64(r, "autofree", flag != NULL);
	fn_graph_instantiate inst = (fn_graph_instantiate)need(r, F_GRAPH_INSTANTIATE);
	if (!inst) {
		r->rc = CUDA_ERROR_NOT_FOUND;
		return 0;
	}
	if (e->exec) {
		fn_graph_exec_destroy destroy = (fn_graph_exec_destroy)resolve(F_GRAPH_EXEC_DESTROY);
		if (destroy)
			destroy(e->exec);
		e->exec = NULL;
	}
	CUgraphExec x = NULL;
	r->rc = inst(&x, e->g, flag ? 1 /* CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH */ : 0);
	if (r->rc == 0)
		e->exec = x;
	return 0;
}

/* An instantiated graph entry, or NULL with the usage error reported. */
static struct graph_entry *graph_exec_arg(struct result *r, const char *name)
{
	struct graph_entry *e = graph_arg(r, name);
	if (e && !e->exec) {
		usage_error(r->op, "CUDRIVE_USAGE", "graph \"%s\" is not instantiated (run: graph %s)", name, name);
		return NULL;
	}
	return e;
}

/* ungraph NAME: cuGraphExecDestroy of its executable (the graph stays). */
static int cmd_ungraph(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	struct graph_entry *e = graph_exec_arg(r, name);
	if (!e)
		return -1;
	res_str(r, "name", name);
	NEED(destroy, fn_graph_exec_destroy, F_GRAPH_EXEC_DESTROY);
	r->rc = destroy(e->exec);
	if (r->rc == 0)
		e->exec = NULL;
	return 0;
}

/* graphupload NAME: cuGraphUpload on cudrive's stream. */
static int cmd_graphupload(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	struct graph_entry *e = graph_exec_arg(r, name);
	if (!e)
		return -1;
	res_str(r, "name", name);
	NEED(upload, fn_graph_upload, F_GRAPH_UPLOAD);
	if ((r->rc = cap_stream(r)) != 0)
		return 0;
	r->rc = upload(e->exec, cap.s);
	forget_stream(r->rc);
	return 0;
}

/* graphmem DEV: the four CUgraphMem_attribute figures of the device. */
static int cmd_graphmem(struct stream *s, struct result *r)
{
	INT_ARG(ord, "DEV");
	NEED(get, fn_graph_mem_attr, F_GRAPH_MEM_GET_ATTR);
	static const char *const keys[4] = {"used", "used_high", "reserved", "reserved_high"};
	CUdevice dev;
	res_i64(r, "dev", ord);
	if ((r->rc = device_get(r, ord, &dev)) != 0)
		return 0;
	for (int a = 0; a < 4; a++) {
		cuuint64_t v = 0;
		CUresult rc = get(dev, a, &v);
		if (rc) {
			r->rc = rc;
			return 0;
		}
		res_u64(r, keys[a], v);
	}
	return 0;
}

/* graphmemreset DEV: both high watermarks down to the current figures. */
static int cmd_graphmemreset(struct stream *s, struct result *r)
{
	INT_ARG(ord, "DEV");
	NEED(set, fn_graph_mem_attr, F_GRAPH_MEM_SET_ATTR);
	CUdevice dev;
	res_i64(r, "dev", ord);
	if ((r->rc = device_get(r, ord, &dev)) != 0)
		return 0;
	cuuint64_t zero = 0;
	if ((r->rc = set(dev, 1 /* USED_MEM_HIGH */, &zero)) == 0)
		r->rc = set(dev, 3 /* RESERVED_MEM_HIGH */, &zero);
	return 0;
}

/* graphtrim DEV: cuDeviceGraphMemTrim. */
static int cmd_graphtrim(struct stream *s, struct result *r)
{
	INT_ARG(ord, "DEV");
	NEED(trim, fn_graph_mem_trim, F_GRAPH_MEM_TRIM);
	CUdevice dev;
	res_i64(r, "dev", ord);
	if ((r->rc = device_get(r, ord, &dev)) == 0)
		r->rc = trim(dev);
	return 0;
}

static int cmd_graphlaunch(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	unsigned long long count, ok = 0, failed = 0;
	if (opt_count(s, r, &count) < 0)
		return -1;
	struct graph_entry *e = graph_exec_arg(r, name);
	if (!e)
		return -1;
	res_str(r, "name", name);
	fn_graph_launch launch = (fn_graph_launch)need(r, F_GRAPH_LAUNCH);
	if (!launch) {
		r->rc = CUDA_ERROR_NOT_FOUND;
		return 0;
	}
	if ((r->rc = cap_stream(r)) != 0)
		return 0;
	for (unsigned long long i = 0; i < count; i++) {
		CUresult rc = launch(e->exec, cap.s);
		if (rc) {
			failed++;
			r->rc = rc;
		} else {
			ok++;
		}
	}
	if (cap.capturing)
		cap.kernels += ok * e->kernels;
	forget_stream(r->rc);
	res_u64(r, "count", ok);
	res_u64(r, "failed", failed);
	res_u64(r, "kernels", e->kernels);
	return 0;
}

/*
 * Timing events around one NS kernel on the NULL stream: start, end and a
 * CU_EVENT_DISABLE_TIMING event. Reports cuEventQuery before and after
 * cuEventSynchronize(end), how long that waited, cuEventElapsedTime(start,
 * end) and its answer for the non-timing event (must be INVALID_HANDLE).
 */
static int cmd_event(struct stream *s, struct result *r)
{
	U64_ARG(ns, "NS");
	res_u64(r, "ns", ns);
	fn_event_create create = (fn_event_create)need(r, F_EVENT_CREATE);
	fn_event_record record = (fn_event_record)need(r, F_EVENT_RECORD);
	fn_event query = (fn_event)need(r, F_EVENT_QUERY);
	fn_event sync = (fn_event)need(r, F_EVENT_SYNCHRONIZE);
	fn_event_elapsed elapsed = (fn_event_elapsed)need(r, F_EVENT_ELAPSED);
	fn_event destroy = (fn_event)need(r, F_EVENT_DESTROY);
	void *launch = need(r, F_LAUNCH_KERNEL);
	if (!create || !record || !query || !sync || !elapsed || !destroy || !launch) {
		r->rc = CUDA_ERROR_NOT_FOUND;
		return 0;
	}
	if ((r->rc = busy_load(r, false)) != 0)
		return 0;
	static const unsigned flags[3] = {0, 0, 2 /* CU_EVENT_DISABLE_TIMING */};
	CUevent ev[3] = {NULL, NULL, NULL};
	int made = 0;
	for (; made < 3; made++)
		if ((r->rc = create(&ev[made], flags[made])) != 0)
			break;
	CUresult lrc = CUDA_SUCCESS;
	if (made == 3 && (r->rc = record(ev[0], NULL)) == 0 &&
	    (r->rc = lrc = launch_busy(L_KERNEL, launch, &ns, NULL)) == 0 && (r->rc = record(ev[1], NULL)) == 0 &&
	    (r->rc = record(ev[2], NULL)) == 0) {
		res_i64(r, "query_before", query(ev[1]));
		uint64_t t0 = now_ns();
		r->rc = sync(ev[1]);
		res_u64(r, "wait_ns", now_ns() - t0);
		res_i64(r, "query_after", query(ev[1]));
		float ms = 0, ms2 = 0;
		CUresult erc = elapsed(&ms, ev[0], ev[1]);
		res_i64(r, "elapsed_rc", erc);
		if (erc == 0)
			res_raw(r, ",\"elapsed_ms\":%.6f", (double)ms);
		res_i64(r, "notiming_rc", elapsed(&ms2, ev[0], ev[2]));
	}
	forget_busy(lrc);
	for (int i = 0; i < made; i++) {
		CUresult drc = destroy(ev[i]);
		if (drc && !r->rc)
			r->rc = drc;
	}
	return 0;
}

/* A graph of BURN_GRAPH_KERNELS kernels of *NS, captured on cudrive's stream
 * and instantiated; *G and *X are set only on success. */
static CUresult burn_graph(struct result *r, unsigned long long *ns, CUgraph *g, CUgraphExec *x)
{
	fn_begin_capture begin = (fn_begin_capture)need(r, F_BEGIN_CAPTURE);
	fn_end_capture end = (fn_end_capture)need(r, F_END_CAPTURE);
	fn_graph_instantiate inst = (fn_graph_instantiate)need(r, F_GRAPH_INSTANTIATE);
	fn_graph_destroy destroy = (fn_graph_destroy)need(r, F_GRAPH_DESTROY);
	void *launch = need(r, F_LAUNCH_KERNEL);
	if (!begin || !end || !inst || !destroy || !launch)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = cap_stream(r);
	if (rc)
		return rc;
	if ((rc = begin(cap.s, 0)) != 0) {
		forget_stream(rc);
		res_str(r, "detail", "cuStreamBeginCapture failed");
		return rc;
	}
	CUresult lrc = CUDA_SUCCESS;
	for (int i = 0; i < BURN_GRAPH_KERNELS && !lrc; i++)
		lrc = launch_busy(L_KERNEL, launch, ns, cap.s);
	CUgraph graph = NULL;
	rc = end(cap.s, &graph); /* always: the capture must not outlive the burn */
	forget_busy(lrc);
	forget_stream(rc);
	if (lrc || rc) {
		if (!rc)
			destroy(graph);
		res_str(r, "detail", lrc ? "launch into the capture failed" : "cuStreamEndCapture failed");
		return lrc ? lrc : rc;
	}
	if ((rc = inst(x, graph, 0)) != 0) {
		destroy(graph);
		res_str(r, "detail", "cuGraphInstantiateWithFlags failed");
		return rc;
	}
	*g = graph;
	return CUDA_SUCCESS;
}

/*
 * burn KIND NS SECONDS [SYNC_EVERY [HOST_NS]]: keep the GPU as busy as this
 * process is allowed to, the way a framework does: launch, spend HOST_NS on
 * the host (a framework's per-launch cost: with HOST_NS > NS the host, not
 * the GPU, sets the pace), and every SYNC_EVERY launches wait for the queue
 * to drain (cuCtxSynchronize). The share is the GPU time launched over the
 * wall time until the last kernel ended.
 */
/* NS of burn: one duration, or a cycle of up to BURN_CYCLE comma-separated
 * ones; their count, or 0 when malformed. */
#define BURN_CYCLE 8
static size_t parse_cycle(const char *s, unsigned long long *ns)
{
	char buf[256];
	size_t n = 0;
	if (!s || strlen(s) >= sizeof(buf))
		return 0;
	strcpy(buf, s);
	for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
		if (n == BURN_CYCLE || !parse_u64(tok, &ns[n++]))
			return 0;
	return n;
}

static int cmd_burn(struct stream *s, struct result *r)
{
	ARG(kind_s, "launch|launchex|coop|graph");
	ARG(ns_s, "NS");
	unsigned long long cycle[BURN_CYCLE];
	size_t ncycle = parse_cycle(ns_s, cycle);
	if (!ncycle) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad NS: \"%s\" (ns, or up to 8 of them: 20000,5000,5000)", ns_s);
		return -1;
	}
	unsigned long long ns = cycle[0];
	ARG(secs_s, "SECONDS");
	double secs;
	if (!parse_seconds(secs_s, &secs)) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad SECONDS: \"%s\" (0 to 86400)", secs_s);
		return -1;
	}
	unsigned long long sync_every = 64;
	const char *se = opt_arg(s);
	if (se && !parse_u64(se, &sync_every)) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad SYNC_EVERY: \"%s\"", se);
		return -1;
	}
	unsigned long long host_ns = 0;
	const char *hn = se ? opt_arg(s) : NULL;
	if (hn && (!parse_u64(hn, &host_ns) || host_ns > 1000000000ull)) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad HOST_NS: \"%s\" (0 to 1000000000)", hn);
		return -1;
	}
	size_t k = 0;
	while (k < sizeof(launch_kinds) / sizeof(launch_kinds[0]) && strcmp(launch_kinds[k].word, kind_s) != 0)
		k++;
	if (k == sizeof(launch_kinds) / sizeof(launch_kinds[0])) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad KIND \"%s\" (launch, launchex, coop, graph)", kind_s);
		return -1;
	}
	if (cap.capturing) {
		usage_error(r->op, "CUDRIVE_USAGE", "burn while a capture is under way (capture end first)");
		return -1;
	}
	enum launch_kind kind = launch_kinds[k].kind;
	unsigned long long per = kind == L_GRAPH ? BURN_GRAPH_KERNELS : 1;
	if (kind == L_GRAPH && ncycle > 1) {
		usage_error(r->op, "CUDRIVE_USAGE", "a graph burns one kernel duration, not \"%s\"", ns_s);
		return -1;
	}
	res_str(r, "kind", kind_s);
	res_u64(r, "ns", ns);
	res_u64(r, "cycle", ncycle);
	res_raw(r, ",\"seconds\":%.3f", secs);
	res_u64(r, "sync_every", sync_every);
	res_u64(r, "host_ns", host_ns);
	fn_void ctxsync = (fn_void)need(r, F_CTX_SYNCHRONIZE);
	void *fn = need(r, launch_kinds[k].fn);
	if (!ctxsync || !fn) {
		r->rc = CUDA_ERROR_NOT_FOUND;
		return 0;
	}
	if ((r->rc = busy_load(r, false)) != 0)
		return 0;
	CUgraph g = NULL;
	CUgraphExec x = NULL;
	if (kind == L_GRAPH && (r->rc = burn_graph(r, &ns, &g, &x)) != 0)
		return 0;
	unsigned long long launches = 0, gpu_ns = 0;
	uint64_t t0 = now_ns(), limit = (uint64_t)(secs * 1e9);
	CUresult rc = CUDA_SUCCESS;
	while (now_ns() - t0 < limit) {
		if (kind == L_GRAPH) {
			rc = ((fn_graph_launch)fn)(x, cap.s);
		} else {
			ns = cycle[launches % ncycle];
			rc = launch_busy(kind, fn, &ns, NULL);
		}
		if (rc)
			break;
		gpu_ns += per * ns;
		launches++;
		for (uint64_t host_end = now_ns() + host_ns; host_ns && now_ns() < host_end;)
			; /* the host's own work between launches */
		if (sync_every && launches % sync_every == 0 && (rc = ctxsync()) != 0)
			break;
	}
	if (kind == L_GRAPH)
		forget_stream(rc);
	else
		forget_busy(rc);
	CUresult src = ctxsync(); /* the last kernel's end is the end of the burn */
	if (!rc)
		rc = src;
	uint64_t elapsed = now_ns() - t0;
	if (kind == L_GRAPH) {
		fn_graph_exec_destroy xd = (fn_graph_exec_destroy)resolve(F_GRAPH_EXEC_DESTROY);
		fn_graph_destroy gd = (fn_graph_destroy)resolve(F_GRAPH_DESTROY);
		if (xd)
			xd(x);
		if (gd)
			gd(g);
	}
	r->rc = rc;
	res_u64(r, "launches", launches);
	res_u64(r, "kernels", launches * per);
	res_u64(r, "gpu_ns", gpu_ns);
	res_u64(r, "elapsed_ns", elapsed);
	res_raw(r, ",\"share\":%.4f", elapsed ? (double)gpu_ns / (double)elapsed : 0.0);
	return 0;
}

/* ---- NVML commands ---------------------------------------------------------- */

static int cmd_nvml(struct stream *s, struct result *r)
{
	r->nvml = true;
	NEED_NVML(f, fn_nvml_void, "nvmlInit_v2");
	r->rc = f();
	return 0;
}

static int cmd_nvmlshutdown(struct stream *s, struct result *r)
{
	r->nvml = true;
	NEED_NVML(f, fn_nvml_void, "nvmlShutdown");
	r->rc = f();
	return 0;
}

static int cmd_nvmlcount(struct stream *s, struct result *r)
{
	r->nvml = true;
	NEED_NVML(f, fn_nvml_count, "nvmlDeviceGetCount_v2");
	unsigned int n = 0;
	r->rc = f(&n);
	if (r->rc == 0)
		res_u64(r, "count", n);
	return 0;
}

static int cmd_nvmlmem(struct stream *s, struct result *r)
{
	INT_ARG(idx, "IDX");
	r->nvml = true;
	NEED_NVML(gethandle, fn_nvml_handle, "nvmlDeviceGetHandleByIndex_v2");
	NEED_NVML(mem, fn_nvml_mem, "nvmlDeviceGetMemoryInfo");
	nvmlDevice_t dev = NULL;
	res_i64(r, "index", idx);
	if ((r->rc = gethandle((unsigned int)idx, &dev)) != 0)
		return 0;
	nvmlMemory_t m;
	memset(&m, 0, sizeof(m));
	r->rc = mem(dev, &m);
	if (r->rc == 0) {
		res_u64(r, "total", m.total);
		res_u64(r, "free", m.free);
		res_u64(r, "used", m.used);
	}
	fn_nvml_mem2 mem2 = (fn_nvml_mem2)nvml_dlsym("nvmlDeviceGetMemoryInfo_v2");
	if (!mem2) {
		res_i64(r, "rc_v2", NVML_ERROR_FUNCTION_NOT_FOUND);
		return 0;
	}
	nvmlMemory_v2_t m2;
	memset(&m2, 0, sizeof(m2));
	m2.version = nvmlMemory_v2;
	int rc2 = mem2(dev, &m2);
	res_i64(r, "rc_v2", rc2);
	if (rc2 == 0) {
		res_u64(r, "total_v2", m2.total);
		res_u64(r, "free_v2", m2.free);
		res_u64(r, "used_v2", m2.used);
		res_u64(r, "reserved_v2", m2.reserved);
	}
	return 0;
}

/* nvmlprocs / nvmlgraphics IDX [1|2|3]: the device's compute or graphics
 * processes through that version of the call (default 3): [{pid, used}]. */
static int running_procs(struct stream *s, struct result *r, const char *base)
{
	INT_ARG(idx, "IDX");
	long long version = 3;
	const char *v = opt_arg(s);
	if (v && (!parse_int(v, &version) || version < 1 || version > 3)) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad VERSION \"%s\" (1, 2, 3)", v);
		return -1;
	}
	char fname[96];
	if (version == 1)
		snprintf(fname, sizeof(fname), "%s", base);
	else
		snprintf(fname, sizeof(fname), "%s_v%lld", base, version);
	r->nvml = true;
	NEED_NVML(gethandle, fn_nvml_handle, "nvmlDeviceGetHandleByIndex_v2");
	NEED_NVML(procs, fn_nvml_procs, fname);
	nvmlDevice_t dev = NULL;
	res_i64(r, "index", idx);
	res_i64(r, "version", version);
	if ((r->rc = gethandle((unsigned int)idx, &dev)) != 0)
		return 0;
	nvmlProcessInfo_t info[64];
	nvml_proc_v1 info1[64];
	unsigned int n = 64;
	memset(info, 0, sizeof(info));
	memset(info1, 0, sizeof(info1));
	if ((r->rc = procs(dev, &n, version == 1 ? (nvmlProcessInfo_t *)(void *)info1 : info)) != 0)
		return 0;
	res_u64(r, "count", n);
	res_raw(r, ",\"processes\":[");
	for (unsigned int i = 0; i < n; i++) {
		unsigned pid = version == 1 ? info1[i].pid : info[i].pid;
		unsigned long long used = version == 1 ? info1[i].usedGpuMemory : info[i].usedGpuMemory;
		res_raw(r, "%s{\"pid\":%u,\"used\":%llu}", i ? "," : "", pid, used);
	}
	res_raw(r, "]");
	return 0;
}

static int cmd_nvmlprocs(struct stream *s, struct result *r)
{
	return running_procs(s, r, "nvmlDeviceGetComputeRunningProcesses");
}

static int cmd_nvmlgraphics(struct stream *s, struct result *r)
{
	return running_procs(s, r, "nvmlDeviceGetGraphicsRunningProcesses");
}

/* ---- the simulated GPU's knobs ------------------------------------------------- */

/* Not driver API: found with dlsym in libcuda.so.1 (only the simulated GPU
 * has them; elsewhere the command reports CUDA_ERROR_NOT_FOUND). */
static void *sim_knob(struct result *r, const char *name)
{
	void *f = cuda_dlsym(name);
	if (!f) {
		r->rc = CUDA_ERROR_NOT_FOUND;
		res_str(r, "detail", resolve_error);
	}
	return f;
}

/* internal DEV SIZE: hamiSimDriverInternal, this process's driver-internal bytes. */
static int cmd_internal(struct stream *s, struct result *r)
{
	INT_ARG(ord, "DEV");
	SIZE_ARG(size, "SIZE");
	res_i64(r, "dev", ord);
	res_u64(r, "size", size);
	fn_sim_internal f = (fn_sim_internal)sim_knob(r, "hamiSimDriverInternal");
	if (f)
		r->rc = f((int)ord, size);
	return 0;
}

/* graphics [0|1]: hamiSimGraphicsProcess (default 1: NVML lists this process
 * as a graphics process). */
static int cmd_graphics(struct stream *s, struct result *r)
{
	long long on = 1;
	const char *v = opt_arg(s);
	if (v && (!parse_int(v, &on) || (on != 0 && on != 1))) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad value \"%s\" (0, 1)", v);
		return -1;
	}
	res_i64(r, "graphics", on);
	fn_sim_graphics f = (fn_sim_graphics)sim_knob(r, "hamiSimGraphicsProcess");
	if (f)
		r->rc = f((int)on);
	return 0;
}

/* events: hamiSimEvents, the events this process holds. */
static int cmd_events(struct stream *s, struct result *r)
{
	unsigned long long n = 0;
	fn_sim_events f = (fn_sim_events)sim_knob(r, "hamiSimEvents");
	if (f && (r->rc = f(&n)) == 0)
		res_u64(r, "events", n);
	return 0;
}

static int cmd_nvmluuid(struct stream *s, struct result *r)
{
	INT_ARG(idx, "IDX");
	r->nvml = true;
	NEED_NVML(gethandle, fn_nvml_handle, "nvmlDeviceGetHandleByIndex_v2");
	NEED_NVML(getuuid, fn_nvml_uuid, "nvmlDeviceGetUUID");
	nvmlDevice_t dev = NULL;
	char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
	res_i64(r, "index", idx);
	if ((r->rc = gethandle((unsigned int)idx, &dev)) != 0)
		return 0;
	memset(buf, 0, sizeof(buf));
	r->rc = getuuid(dev, buf, sizeof(buf));
	buf[sizeof(buf) - 1] = 0;
	if (r->rc == 0)
		res_str(r, "uuid", buf);
	return 0;
}

/* ---- NVDEC commands ------------------------------------------------------------ */

/* Mapped frames cudrive remembers: decoder handle, address, which API mapped it. */
#define MAX_MAPPINGS 1024
static struct mapping {
	void *dec;
	unsigned long long ptr;
	bool is32;
} mappings[MAX_MAPPINGS];
static size_t nmappings;

static void mapping_add(void *dec, unsigned long long ptr, bool is32)
{
	if (nmappings < MAX_MAPPINGS)
		mappings[nmappings++] = (struct mapping){dec, ptr, is32};
}

static void mapping_drop(size_t i)
{
	memmove(&mappings[i], &mappings[i + 1], (nmappings - i - 1) * sizeof(mappings[0]));
	nmappings--;
}

/* Forget DEC's mappings (it is gone). */
static void mappings_forget(void *dec)
{
	for (size_t i = nmappings; i-- > 0;)
		if (mappings[i].dec == dec)
			mapping_drop(i);
}

static unsigned long long mappings_of(void *dec)
{
	unsigned long long n = 0;
	for (size_t i = 0; i < nmappings; i++)
		n += mappings[i].dec == dec;
	return n;
}

static CUresult destroy_cuvid(struct result *r, struct obj *o)
{
	CUresult rc;
	if (o->kind == K_DECODER) {
		fn_cuvid_destroy f = (fn_cuvid_destroy)cuvid_dlsym("cuvidDestroyDecoder");
		if (!f) {
			res_str(r, "detail", resolve_error);
			return CUDA_ERROR_NOT_FOUND;
		}
		void *h = o->h;
		rc = f((CUvideodecoder)h);
		if (rc == 0)
			mappings_forget(h);
	} else {
		fn_cuvid_parser_destroy f = (fn_cuvid_parser_destroy)cuvid_dlsym("cuvidDestroyVideoParser");
		if (!f) {
			res_str(r, "detail", resolve_error);
			return CUDA_ERROR_NOT_FOUND;
		}
		rc = f((CUvideoparser)o->h);
	}
	if (rc == 0)
		obj_remove(o);
	return rc;
}

/*
 * The handle NAME stands for: the object of that name and KIND (*O set), or,
 * when no object has that name, a raw handle written 0x... (*O NULL).
 * -1: a usage error, already reported.
 */
static int cuvid_handle(struct result *r, const char *name, enum obj_kind kind, void **h, struct obj **o)
{
	struct obj *found = obj_find(name);
	unsigned long long v;
	*o = NULL;
	if (found && found->kind == kind) {
		*o = found;
		*h = found->h;
	} else if (!found && (strncmp(name, "0x", 2) == 0 || strncmp(name, "0X", 2) == 0) && parse_u64(name, &v)) {
		*h = (void *)(uintptr_t)v;
	} else {
		usage_error(r->op, "CUDRIVE_NO_SUCH_NAME", "no %s named \"%s\"", kind_name[kind], name);
		return -1;
	}
	res_str(r, "name", name);
	return 0;
}

/* A required NAME for a new object: not too long, not in use. */
static int fresh_name(struct result *r, const char *name)
{
	if (strlen(name) >= NAME_LEN) {
		usage_error(r->op, "CUDRIVE_USAGE", "name too long: \"%s\"", name);
		return -1;
	}
	if (obj_find(name)) {
		usage_error(r->op, "CUDRIVE_NAME_IN_USE", "name in use: \"%s\"", name);
		return -1;
	}
	return 0;
}

struct named_value {
	const char *name;
	int value;
};

static const struct named_value codecs[] = {
	{"mpeg1", 0}, {"mpeg2", cudaVideoCodec_MPEG2}, {"mpeg4", 2}, {"vc1", 3}, {"h264", cudaVideoCodec_H264},
	{"jpeg", 5}, {"vp8", 9}, {"vp9", 10}, {"hevc", cudaVideoCodec_HEVC}, {"h265", cudaVideoCodec_HEVC},
	{"av1", cudaVideoCodec_AV1}, {NULL, 0}};

static const struct named_value chromas[] = {
	{"mono", cudaVideoChromaFormat_Monochrome}, {"400", cudaVideoChromaFormat_Monochrome},
	{"420", cudaVideoChromaFormat_420}, {"422", cudaVideoChromaFormat_422}, {"444", cudaVideoChromaFormat_444},
	{NULL, 0}};

static const struct named_value formats[] = {
	{"nv12", cudaVideoSurfaceFormat_NV12}, {"p016", cudaVideoSurfaceFormat_P016},
	{"yuv444", cudaVideoSurfaceFormat_YUV444}, {"yuv444_16", cudaVideoSurfaceFormat_YUV444_16Bit},
	{"nv16", cudaVideoSurfaceFormat_NV16}, {"p216", cudaVideoSurfaceFormat_P216}, {NULL, 0}};

/* A name of TABLE, or (numbers: NUMERIC) a number. */
static bool parse_named(const struct named_value *table, const char *s, bool numeric, int *out)
{
	for (int i = 0; table[i].name; i++) {
		if (strcasecmp(table[i].name, s) == 0) {
			*out = table[i].value;
			return true;
		}
	}
	long long v;
	if (numeric && parse_int(s, &v) && v >= 0 && v <= 0xffff) {
		*out = (int)v;
		return true;
	}
	return false;
}

/* BITDEPTH: 8 to 16 bits, as bitDepthMinus8. */
static bool parse_depth(const char *s, unsigned *minus8)
{
	long long v;
	if (!parse_int(s, &v) || v < 8 || v > 16)
		return false;
	*minus8 = (unsigned)(v - 8);
	return true;
}

static int cmd_cuvidcaps(struct stream *s, struct result *r)
{
	ARG(codec_s, "CODEC");
	ARG(chroma_s, "CHROMA");
	ARG(depth_s, "BITDEPTH");
	int codec, chroma;
	unsigned minus8;
	if (!parse_named(codecs, codec_s, true, &codec) || !parse_named(chromas, chroma_s, false, &chroma) ||
	    !parse_depth(depth_s, &minus8)) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad CODEC CHROMA BITDEPTH: \"%s %s %s\"", codec_s, chroma_s,
			    depth_s);
		return -1;
	}
	NEED_CUVID(f, fn_cuvid_caps, "cuvidGetDecoderCaps");
	CUVIDDECODECAPS c;
	memset(&c, 0, sizeof(c));
	c.eCodecType = codec;
	c.eChromaFormat = chroma;
	c.nBitDepthMinus8 = minus8;
	res_i64(r, "codec", codec);
	res_i64(r, "chroma", chroma);
	res_u64(r, "bitdepth", minus8 + 8);
	r->rc = f(&c);
	if (r->rc == 0) {
		res_raw(r, ",\"supported\":%s", c.bIsSupported ? "true" : "false");
		res_u64(r, "nvdecs", c.nNumNVDECs);
		res_u64(r, "max_width", c.nMaxWidth);
		res_u64(r, "max_height", c.nMaxHeight);
		res_u64(r, "min_width", c.nMinWidth);
		res_u64(r, "min_height", c.nMinHeight);
		res_u64(r, "output_mask", c.nOutputFormatMask);
		res_u64(r, "max_mb_count", c.nMaxMBCount);
	}
	return 0;
}

/* The output format that goes with a chroma format and bit depth. */
static int default_format(int chroma, unsigned minus8)
{
	switch (chroma) {
	case cudaVideoChromaFormat_444:
		return minus8 ? cudaVideoSurfaceFormat_YUV444_16Bit : cudaVideoSurfaceFormat_YUV444;
	case cudaVideoChromaFormat_422:
		return minus8 ? cudaVideoSurfaceFormat_P216 : cudaVideoSurfaceFormat_NV16;
	default:
		return minus8 ? cudaVideoSurfaceFormat_P016 : cudaVideoSurfaceFormat_NV12;
	}
}

/* WxH */
static bool parse_wxh(const char *s, unsigned long long *w, unsigned long long *h)
{
	char buf[64];
	const char *x = strchr(s, 'x');
	if (!x || (size_t)(x - s) >= sizeof(buf))
		return false;
	memcpy(buf, s, (size_t)(x - s));
	buf[x - s] = 0;
	return parse_u64(buf, w) && parse_u64(x + 1, h);
}

static short clamp_short(unsigned long long v)
{
	return v > 32767 ? 32767 : (short)v;
}

static int cmd_decoder(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	U64_ARG(width, "WIDTH");
	U64_ARG(height, "HEIGHT");
	U64_ARG(surfaces, "SURFACES");
	if (fresh_name(r, name) < 0)
		return -1;
	unsigned long long outsurf = 2, maxw = 0, maxh = 0, tw = 0, th = 0;
	int codec = cudaVideoCodec_H264, chroma = cudaVideoChromaFormat_420, format = -1;
	unsigned minus8 = 0;
	int positional = 0;
	for (const char *w; (w = opt_arg(s));) {
		const char *eq = strchr(w, '=');
		bool ok;
		if (!eq) {
			unsigned long long v;
			ok = positional < 3 && parse_u64(w, &v);
			if (ok)
				*(positional == 0 ? &outsurf : positional == 1 ? &maxw : &maxh) = v;
			positional++;
		} else {
			size_t klen = (size_t)(eq - w);
			const char *v = eq + 1;
#define KEY(k) (klen == strlen(k) && strncmp(w, k, klen) == 0)
			if (KEY("out"))
				ok = parse_u64(v, &outsurf);
			else if (KEY("maxw"))
				ok = parse_u64(v, &maxw);
			else if (KEY("maxh"))
				ok = parse_u64(v, &maxh);
			else if (KEY("codec"))
				ok = parse_named(codecs, v, true, &codec);
			else if (KEY("chroma"))
				ok = parse_named(chromas, v, false, &chroma);
			else if (KEY("bitdepth"))
				ok = parse_depth(v, &minus8);
			else if (KEY("format"))
				ok = parse_named(formats, v, true, &format);
			else if (KEY("target"))
				ok = parse_wxh(v, &tw, &th);
			else
				ok = false;
#undef KEY
		}
		if (!ok) {
			usage_error(r->op, "CUDRIVE_USAGE", "bad decoder option \"%s\"", w);
			return -1;
		}
	}
	if (format < 0)
		format = default_format(chroma, minus8);
	if (!maxw)
		maxw = width;
	if (!maxh)
		maxh = height;
	if (!tw)
		tw = width;
	if (!th)
		th = height;
	NEED_CUVID(f, fn_cuvid_create, "cuvidCreateDecoder");
	CUVIDDECODECREATEINFO ci;
	memset(&ci, 0, sizeof(ci));
	ci.ulWidth = (unsigned long)width;
	ci.ulHeight = (unsigned long)height;
	ci.ulNumDecodeSurfaces = (unsigned long)surfaces;
	ci.CodecType = codec;
	ci.ChromaFormat = chroma;
	ci.ulCreationFlags = 0; /* cudaVideoCreate_Default */
	ci.bitDepthMinus8 = minus8;
	ci.ulIntraDecodeOnly = 0;
	ci.ulMaxWidth = (unsigned long)maxw;
	ci.ulMaxHeight = (unsigned long)maxh;
	ci.display_area.left = 0;
	ci.display_area.top = 0;
	ci.display_area.right = clamp_short(width);
	ci.display_area.bottom = clamp_short(height);
	ci.OutputFormat = format;
	ci.DeinterlaceMode = 0; /* cudaVideoDeinterlaceMode_Weave: progressive content */
	ci.ulTargetWidth = (unsigned long)tw;
	ci.ulTargetHeight = (unsigned long)th;
	ci.ulNumOutputSurfaces = (unsigned long)outsurf;
	ci.vidLock = NULL;
	res_str(r, "name", name);
	res_i64(r, "codec", codec);
	res_i64(r, "chroma", chroma);
	res_u64(r, "bitdepth", minus8 + 8);
	res_u64(r, "width", width);
	res_u64(r, "height", height);
	res_u64(r, "surfaces", surfaces);
	res_u64(r, "outsurf", outsurf);
	res_u64(r, "maxw", maxw);
	res_u64(r, "maxh", maxh);
	res_u64(r, "target_width", tw);
	res_u64(r, "target_height", th);
	res_i64(r, "format", format);
	CUvideodecoder dec = NULL;
	r->rc = f(&dec, &ci);
	if (r->rc == 0) {
		res_hex(r, "decoder", dec);
		struct obj *o = obj_add(name, K_DECODER);
		if (o)
			o->h = dec;
		else
			res_str(r, "detail", "out of host memory for the object table");
	}
	return 0;
}

static int cmd_undecoder(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	void *h;
	struct obj *o;
	if (cuvid_handle(r, name, K_DECODER, &h, &o) < 0)
		return -1;
	if (o) {
		r->rc = destroy_cuvid(r, o);
		return 0;
	}
	NEED_CUVID(f, fn_cuvid_destroy, "cuvidDestroyDecoder");
	r->rc = f((CUvideodecoder)h);
	if (r->rc == 0)
		mappings_forget(h);
	return 0;
}

static int cmd_decode(struct stream *s, struct result *r)
{
	static unsigned char params[4096] __attribute__((aligned(64)));
	ARG(name, "NAME");
	unsigned long long count = 1;
	const char *c = opt_arg(s);
	if (c && !parse_u64(c, &count)) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad COUNT: \"%s\"", c);
		return -1;
	}
	void *h;
	struct obj *o;
	if (cuvid_handle(r, name, K_DECODER, &h, &o) < 0)
		return -1;
	NEED_CUVID(f, fn_cuvid_decode, "cuvidDecodePicture");
	unsigned long long done = 0;
	uint64_t t0 = now_ns();
	for (; done < count; done++) {
		memset(params, 0, sizeof(params));
		if ((r->rc = f((CUvideodecoder)h, (CUVIDPICPARAMS *)params)) != 0)
			break;
	}
	res_u64(r, "count", count);
	res_u64(r, "decoded", done);
	res_u64(r, "elapsed_ns", now_ns() - t0);
	return 0;
}

static int map_common(struct stream *s, struct result *r, bool is32)
{
	static unsigned char proc[1024] __attribute__((aligned(64)));
	ARG(name, "NAME");
	INT_ARG(pic, "PICIDX");
	void *h;
	struct obj *o;
	if (cuvid_handle(r, name, K_DECODER, &h, &o) < 0)
		return -1;
	memset(proc, 0, sizeof(proc));
	int progressive = 1; /* progressive_frame, the first field of CUVIDPROCPARAMS */
	memcpy(proc, &progressive, sizeof(progressive));
	unsigned long long ptr = 0;
	unsigned int pitch = 0;
	res_i64(r, "pic", pic);
	if (is32) {
		NEED_CUVID(f, fn_cuvid_map32, "cuvidMapVideoFrame");
		unsigned int p32 = 0;
		r->rc = f((CUvideodecoder)h, (int)pic, &p32, &pitch, (CUVIDPROCPARAMS *)proc);
		ptr = p32;
	} else {
		NEED_CUVID(f, fn_cuvid_map64, "cuvidMapVideoFrame64");
		r->rc = f((CUvideodecoder)h, (int)pic, &ptr, &pitch, (CUVIDPROCPARAMS *)proc);
	}
	if (r->rc == 0) {
		mapping_add(h, ptr, is32);
		res_u64(r, "ptr", ptr);
		res_u64(r, "pitch", pitch);
	}
	res_u64(r, "mapped", mappings_of(h));
	return 0;
}

static int cmd_mapframe(struct stream *s, struct result *r)
{
	return map_common(s, r, false);
}

static int cmd_mapframe32(struct stream *s, struct result *r)
{
	return map_common(s, r, true);
}

static int unmap_common(struct stream *s, struct result *r, bool is32)
{
	ARG(name, "NAME");
	const char *p = opt_arg(s);
	unsigned long long ptr = 0;
	if (p && !parse_u64(p, &ptr)) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad PTR: \"%s\"", p);
		return -1;
	}
	void *h;
	struct obj *o;
	if (cuvid_handle(r, name, K_DECODER, &h, &o) < 0)
		return -1;
	size_t k = nmappings;
	for (size_t i = 0; i < nmappings; i++) {
		if (mappings[i].dec == h && mappings[i].is32 == is32 && (!p || mappings[i].ptr == ptr)) {
			k = i;
			break;
		}
	}
	if (!p) {
		if (k == nmappings) {
			usage_error(r->op, "CUDRIVE_NOT_MAPPED", "no %s frame of \"%s\" is mapped",
				    is32 ? "32-bit" : "64-bit", name);
			return -1;
		}
		ptr = mappings[k].ptr;
	}
	res_u64(r, "ptr", ptr);
	if (is32) {
		NEED_CUVID(f, fn_cuvid_unmap32, "cuvidUnmapVideoFrame");
		r->rc = f((CUvideodecoder)h, (unsigned int)ptr);
	} else {
		NEED_CUVID(f, fn_cuvid_unmap64, "cuvidUnmapVideoFrame64");
		r->rc = f((CUvideodecoder)h, ptr);
	}
	if (r->rc == 0 && k < nmappings)
		mapping_drop(k);
	res_u64(r, "mapped", mappings_of(h));
	return 0;
}

static int cmd_unmapframe(struct stream *s, struct result *r)
{
	return unmap_common(s, r, false);
}

static int cmd_unmapframe32(struct stream *s, struct result *r)
{
	return unmap_common(s, r, true);
}

/* CUVIDRECONFIGUREDECODERINFO, padded: the library may know a longer form. */
union reconfigure_info {
	struct {
		unsigned int ulWidth;
		unsigned int ulHeight;
		unsigned int ulTargetWidth;
		unsigned int ulTargetHeight;
		unsigned int ulNumDecodeSurfaces;
		unsigned int reserved1[12];
		CUVIDRECT16 display_area;
		CUVIDRECT16 target_rect;
		unsigned int reserved2[11];
	} f;
	unsigned char pad[1024];
};

static int cmd_reconfigure(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	U64_ARG(width, "WIDTH");
	U64_ARG(height, "HEIGHT");
	U64_ARG(surfaces, "SURFACES");
	unsigned long long tw = width, th = height;
	const char *a = opt_arg(s);
	if (a) {
		const char *b = opt_arg(s);
		if (!b || !parse_u64(a, &tw) || !parse_u64(b, &th)) {
			usage_error(r->op, "CUDRIVE_USAGE", "bad TW TH: \"%s %s\"", a, b ? b : "");
			return -1;
		}
	}
	void *h;
	struct obj *o;
	if (cuvid_handle(r, name, K_DECODER, &h, &o) < 0)
		return -1;
	NEED_CUVID(f, fn_cuvid_reconfigure, "cuvidReconfigureDecoder");
	union reconfigure_info info;
	memset(&info, 0, sizeof(info));
	info.f.ulWidth = (unsigned int)width;
	info.f.ulHeight = (unsigned int)height;
	info.f.ulTargetWidth = (unsigned int)tw;
	info.f.ulTargetHeight = (unsigned int)th;
	info.f.ulNumDecodeSurfaces = (unsigned int)surfaces;
	info.f.display_area.right = clamp_short(width);
	info.f.display_area.bottom = clamp_short(height);
	res_u64(r, "width", width);
	res_u64(r, "height", height);
	res_u64(r, "surfaces", surfaces);
	res_u64(r, "target_width", tw);
	res_u64(r, "target_height", th);
	r->rc = f((CUvideodecoder)h, (CUVIDRECONFIGUREDECODERINFO *)&info);
	return 0;
}

static int cmd_decodestatus(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	INT_ARG(pic, "PICIDX");
	void *h;
	struct obj *o;
	if (cuvid_handle(r, name, K_DECODER, &h, &o) < 0)
		return -1;
	NEED_CUVID(f, fn_cuvid_status, "cuvidGetDecodeStatus");
	/* CUVIDGETDECODESTATUS (192 bytes), padded; decodeStatus is its first int. */
	union {
		int status;
		unsigned char pad[1024];
	} st;
	memset(&st, 0, sizeof(st));
	st.status = -1;
	res_i64(r, "pic", pic);
	r->rc = f((CUvideodecoder)h, (int)pic, &st);
	if (r->rc == 0)
		res_i64(r, "status", st.status);
	return 0;
}

/* The head of CUVIDPARSERPARAMS, padded: callbacks and the rest stay zero. */
union parser_params {
	struct {
		int CodecType;
		unsigned int ulMaxNumDecodeSurfaces;
		unsigned int ulClockRate;
		unsigned int ulErrorThreshold;
		unsigned int ulMaxDisplayDelay;
	} f;
	unsigned char pad[1024];
};

static int cmd_parser(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	if (fresh_name(r, name) < 0)
		return -1;
	int codec = cudaVideoCodec_H264;
	const char *c = opt_arg(s);
	if (c && (strncmp(c, "codec=", 6) != 0 || !parse_named(codecs, c + 6, true, &codec))) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad parser option \"%s\" (codec=C)", c);
		return -1;
	}
	NEED_CUVID(f, fn_cuvid_parser_create, "cuvidCreateVideoParser");
	union parser_params p;
	memset(&p, 0, sizeof(p));
	p.f.CodecType = codec;
	p.f.ulMaxNumDecodeSurfaces = 1;
	res_str(r, "name", name);
	res_i64(r, "codec", codec);
	CUvideoparser parser = NULL;
	r->rc = f(&parser, (CUVIDPARSERPARAMS *)&p);
	if (r->rc == 0) {
		res_hex(r, "parser", parser);
		struct obj *o = obj_add(name, K_PARSER);
		if (o)
			o->h = parser;
		else
			res_str(r, "detail", "out of host memory for the object table");
	}
	return 0;
}

static int cmd_unparser(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	void *h;
	struct obj *o;
	if (cuvid_handle(r, name, K_PARSER, &h, &o) < 0)
		return -1;
	if (o) {
		r->rc = destroy_cuvid(r, o);
		return 0;
	}
	NEED_CUVID(f, fn_cuvid_parser_destroy, "cuvidDestroyVideoParser");
	r->rc = f((CUvideoparser)h);
	return 0;
}

/* ctxlock: a lock on the current context, locked (which makes its context
 * current), unlocked and destroyed; each step's result, rc the first failure. */
static int cmd_ctxlock(struct stream *s, struct result *r)
{
	NEED_CUVID(create, fn_cuvid_lock_create, "cuvidCtxLockCreate");
	NEED_CUVID(destroy, fn_cuvid_lock_destroy, "cuvidCtxLockDestroy");
	NEED_CUVID(lock, fn_cuvid_lock, "cuvidCtxLock");
	NEED_CUVID(unlock, fn_cuvid_lock, "cuvidCtxUnlock");
	NEED(getcur, fn_ctx_get_current, F_CTX_GET_CURRENT);
	CUcontext ctx = NULL, inside = NULL;
	if ((r->rc = getcur(&ctx)) != 0)
		return 0;
	res_hex(r, "ctx", ctx);
	CUvideoctxlock l = NULL;
	CUresult rc = create(&l, ctx);
	res_i64(r, "rc_create", rc);
	if (rc) {
		r->rc = rc;
		return 0;
	}
	res_hex(r, "lock", l);
	rc = lock(l, 0);
	res_i64(r, "rc_lock", rc);
	if (!r->rc)
		r->rc = rc;
	if (rc == 0) {
		CUresult grc = getcur(&inside);
		res_raw(r, ",\"current_is_ctx\":%s", grc == 0 && inside == ctx ? "true" : "false");
		rc = unlock(l, 0);
		res_i64(r, "rc_unlock", rc);
		if (!r->rc)
			r->rc = rc;
	}
	rc = destroy(l);
	res_i64(r, "rc_destroy", rc);
	if (!r->rc)
		r->rc = rc;
	return 0;
}

static int cmd_cuviddlsym(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	res_str(r, "symbol", name);
	void *p = cuvid_dlsym(name);
	if (!p) {
		r->rc = CUDA_ERROR_NOT_FOUND;
		res_str(r, "detail", resolve_error);
	}
	describe_ptr(r, p);
	return 0;
}

/* ---- virtual memory management ------------------------------------------------ */

static CUmemAllocationProp device_prop(int ordinal)
{
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = ordinal;
	return prop;
}

/* A named range or mapped memory, and OFFSET inside it. */
static struct obj *vm_obj(struct result *r, const char *name, const char *what)
{
	struct obj *o = obj_find(name);
	if (!o || (o->kind != K_RANGE && o->kind != K_VMEM)) {
		usage_error(r->op, "CUDRIVE_NO_SUCH_NAME", "no %s named \"%s\"", what, name);
		return NULL;
	}
	return o;
}

/* Ranges: cuMemAddressFree. Mapped memory of vmalloc: unmapped, released, freed. */
static CUresult destroy_vm(struct result *r, struct obj *o)
{
	fn_addr_free addr_free = (fn_addr_free)need(r, F_ADDR_FREE);
	if (!addr_free)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = CUDA_SUCCESS;
	if (o->kind == K_VMEM) {
		fn_mem_unmap unmap = (fn_mem_unmap)need(r, F_MEM_UNMAP);
		fn_mem_release release = (fn_mem_release)need(r, F_MEM_RELEASE);
		if (!unmap || !release)
			return CUDA_ERROR_NOT_FOUND;
		if ((rc = unmap(o->ptr, o->size)) != 0 || (rc = release(o->handle)) != 0)
			return rc;
	}
	if ((rc = addr_free(o->ptr, o->size)) == 0)
		obj_remove(o);
	return rc;
}

/* vmalloc SIZE DEV [NAME]: memory a program maps itself, as PyTorch's
 * expandable segments do: cuMemCreate, cuMemAddressReserve, cuMemMap,
 * cuMemSetAccess (read-write for DEV); SIZE rounded up to the granularity. */
static int cmd_vmalloc(struct stream *s, struct result *r)
{
	char name[NAME_LEN];
	SIZE_ARG(size, "SIZE");
	INT_ARG(ord, "DEV");
	if (new_name(s, r, name, "v") < 0)
		return -1;
	NEED(gran, fn_granularity, F_GRANULARITY);
	NEED(create, fn_mem_create, F_MEM_CREATE);
	NEED(reserve, fn_addr_reserve, F_ADDR_RESERVE);
	NEED(map, fn_mem_map, F_MEM_MAP);
	NEED(access, fn_set_access, F_SET_ACCESS);
	CUmemAllocationProp prop = device_prop((int)ord);
	size_t g = 0;
	if ((r->rc = gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) != 0)
		return 0;
	unsigned long long span = (size + g - 1) / g * g;
	CUmemGenericAllocationHandle h = 0;
	CUdeviceptr p = 0;
	CUmemAccessDesc desc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	res_u64(r, "size", span);
	if ((r->rc = create(&h, span, &prop, 0)) != 0)
		return 0;
	if ((r->rc = reserve(&p, span, 0, 0, 0)) != 0 || (r->rc = map(p, span, 0, h, 0)) != 0 ||
	    (r->rc = access(p, span, &desc, 1)) != 0) {
		res_str(r, "detail", "reserve, map or set access failed");
		return 0; /* what was made is left behind: a test of failures looks at it */
	}
	struct obj *o = store(r, name, K_VMEM);
	if (o) {
		o->ptr = p;
		o->size = span;
		o->handle = h;
	}
	res_u64(r, "ptr", p);
	return 0;
}

static const char *const access_names[] = {"none", "r", "", "rw"};

/* vm reserve NAME SIZE [ALIGN [ADDR]] | vm map RANGE OFFSET HANDLE [SIZE [HANDLE_OFFSET]] |
 * vm unmap RANGE OFFSET SIZE | vm access RANGE OFFSET SIZE DEV none|r|rw |
 * vm getaccess RANGE OFFSET DEV | vm retain RANGE OFFSET NAME | vm gran DEV:
 * the virtual memory calls one by one, to show the driver's rules. */
static int cmd_vm(struct stream *s, struct result *r)
{
	ARG(what, "reserve|map|unmap|access|getaccess|retain|gran");
	res_str(r, "call", what);
	if (strcmp(what, "gran") == 0) {
		INT_ARG(ord, "DEV");
		NEED(gran, fn_granularity, F_GRANULARITY);
		CUmemAllocationProp prop = device_prop((int)ord);
		size_t g = 0;
		if ((r->rc = gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) == 0)
			res_u64(r, "granularity", g);
		return 0;
	}
	if (strcmp(what, "reserve") == 0) {
		ARG(name, "NAME");
		SIZE_ARG(size, "SIZE");
		unsigned long long align = 0, addr = 0;
		const char *a = opt_arg(s), *b = a ? opt_arg(s) : NULL;
		if ((a && !parse_size(a, &align)) || (b && !parse_u64(b, &addr))) {
			usage_error(r->op, "CUDRIVE_USAGE", "bad ALIGN or ADDR");
			return -1;
		}
		if (strlen(name) >= NAME_LEN || obj_find(name)) {
			usage_error(r->op, "CUDRIVE_NAME_IN_USE", "bad or used name: \"%s\"", name);
			return -1;
		}
		NEED(reserve, fn_addr_reserve, F_ADDR_RESERVE);
		CUdeviceptr p = 0;
		res_u64(r, "size", size);
		if ((r->rc = reserve(&p, size, align, addr, 0)) == 0) {
			struct obj *o = store(r, name, K_RANGE);
			if (o) {
				o->ptr = p;
				o->size = size;
			}
			res_u64(r, "ptr", p);
		}
		return 0;
	}
	ARG(rname, "RANGE");
	struct obj *range = vm_obj(r, rname, "range");
	if (!range)
		return -1;
	if (strcmp(what, "map") == 0) {
		SIZE_ARG(off, "OFFSET");
		ARG(hname, "HANDLE");
		struct obj *h = obj_find(hname);
		if (!h || h->kind != K_HANDLE) {
			usage_error(r->op, "CUDRIVE_NO_SUCH_NAME", "no handle named \"%s\"", hname);
			return -1;
		}
		unsigned long long size = h->size, hoff = 0;
		const char *a = opt_arg(s), *b = a ? opt_arg(s) : NULL;
		if ((a && !parse_size(a, &size)) || (b && !parse_size(b, &hoff))) {
			usage_error(r->op, "CUDRIVE_USAGE", "bad SIZE or HANDLE_OFFSET");
			return -1;
		}
		NEED(map, fn_mem_map, F_MEM_MAP);
		r->rc = map(range->ptr + off, size, hoff, h->handle, 0);
		return 0;
	}
	SIZE_ARG(off, "OFFSET");
	if (strcmp(what, "unmap") == 0) {
		SIZE_ARG(size, "SIZE");
		NEED(unmap, fn_mem_unmap, F_MEM_UNMAP);
		r->rc = unmap(range->ptr + off, size);
		return 0;
	}
	if (strcmp(what, "access") == 0) {
		SIZE_ARG(size, "SIZE");
		INT_ARG(ord, "DEV");
		ARG(how, "none|r|rw");
		int flags = strcmp(how, "rw") == 0 ? 3 : strcmp(how, "r") == 0 ? 1 : strcmp(how, "none") == 0 ? 0 : -1;
		if (flags < 0) {
			usage_error(r->op, "CUDRIVE_USAGE", "bad access \"%s\" (none, r, rw)", how);
			return -1;
		}
		NEED(access, fn_set_access, F_SET_ACCESS);
		CUmemAccessDesc desc = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, (int)ord}, .flags = flags};
		r->rc = access(range->ptr + off, size, &desc, 1);
		return 0;
	}
	if (strcmp(what, "getaccess") == 0) {
		INT_ARG(ord, "DEV");
		NEED(get, fn_get_access, F_GET_ACCESS);
		CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, (int)ord};
		unsigned long long flags = 0;
		if ((r->rc = get(&flags, &loc, range->ptr + off)) == 0)
			res_str(r, "access", flags < 4 ? access_names[flags] : "?");
		return 0;
	}
	if (strcmp(what, "retain") == 0) {
		char name[NAME_LEN];
		if (new_name(s, r, name, "h") < 0)
			return -1;
		NEED(retain, fn_retain_handle, F_RETAIN_HANDLE);
		CUmemGenericAllocationHandle h = 0;
		if ((r->rc = retain(&h, (void *)(uintptr_t)(range->ptr + off))) == 0) {
			struct obj *o = store(r, name, K_HANDLE);
			if (o)
				o->handle = h;
			res_u64(r, "handle", h);
		}
		return 0;
	}
	usage_error(r->op, "CUDRIVE_USAGE", "unknown vm call \"%s\"", what);
	return -1;
}

/* Device memory by name (any kind that has an address), and an optional OFFSET into it. */
static struct obj *addr_args(struct stream *s, struct result *r, unsigned long long *off)
{
	const char *name = next_arg(s);
	if (!name) {
		usage_error(r->op, "CUDRIVE_USAGE", "missing argument: NAME");
		return NULL;
	}
	struct obj *o = obj_find(name);
	if (!o || !o->ptr) {
		usage_error(r->op, "CUDRIVE_NO_SUCH_NAME", "no device memory named \"%s\"", name);
		return NULL;
	}
	const char *a = opt_arg(s);
	*off = 0;
	if (a && !parse_size(a, off)) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad OFFSET: \"%s\"", a);
		return NULL;
	}
	res_str(r, "name", name);
	return o;
}

/* range NAME [OFFSET]: cuMemGetAddressRange_v2 of an address in NAME: base
 * (and base_offset, from NAME's own start) and size. */
static int cmd_range(struct stream *s, struct result *r)
{
	unsigned long long off;
	struct obj *o = addr_args(s, r, &off);
	if (!o)
		return -1;
	NEED(f, fn_address_range, F_ADDRESS_RANGE);
	CUdeviceptr base = 0;
	size_t size = 0;
	if ((r->rc = f(&base, &size, o->ptr + off)) == 0) {
		res_u64(r, "base", base);
		res_i64(r, "base_offset", (long long)(base - o->ptr));
		res_u64(r, "size", size);
	}
	return 0;
}

/* ptrattr NAME [OFFSET]: cuPointerGetAttributes of the attributes programs ask. */
static int cmd_ptrattr(struct stream *s, struct result *r)
{
	unsigned long long off;
	struct obj *o = addr_args(s, r, &off);
	if (!o)
		return -1;
	NEED(f, fn_pointer_attrs, F_POINTER_ATTRS);
	CUcontext ctx = NULL;
	unsigned type = 0;
	int ordinal = -1, ipc = 0, mapped = 0, managed = 0;
	CUdeviceptr start = 0;
	size_t size = 0;
	unsigned long long buffer = 0;
	int attrs[] = {CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
		       CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
		       CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
		       CU_POINTER_ATTRIBUTE_MAPPED, CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_IS_MANAGED};
	void *data[] = {&ctx, &type, &ordinal, &ipc, &start, &size, &mapped, &buffer, &managed};
	if ((r->rc = f(sizeof(attrs) / sizeof(attrs[0]), attrs, data, o->ptr + off)) == 0) {
		res_hex(r, "context", ctx);
		res_u64(r, "type", type);
		res_i64(r, "ordinal", ordinal);
		res_i64(r, "ipc", ipc);
		res_i64(r, "start_offset", (long long)(start - o->ptr));
		res_u64(r, "size", size);
		res_i64(r, "mapped", mapped);
		res_i64(r, "managed", managed);
		res_raw(r, ",\"buffer_id\":%s", buffer ? "true" : "false");
	}
	return 0;
}

/* ipc NAME: cuIpcGetMemHandle of NAME's base. */
static int cmd_ipc(struct stream *s, struct result *r)
{
	unsigned long long off;
	struct obj *o = addr_args(s, r, &off);
	if (!o)
		return -1;
	NEED(f, fn_ipc_handle, F_IPC_HANDLE);
	CUipcMemHandle h;
	r->rc = f(&h, o->ptr + off);
	return 0;
}

/* peer DEV: the current context may reach DEV's memory (cuCtxEnablePeerAccess
 * with DEV's primary context, retained here). */
static int cmd_peer(struct stream *s, struct result *r)
{
	INT_ARG(ord, "DEV");
	NEED(retain, fn_primary_retain, F_PRIMARY_RETAIN);
	NEED(enable, fn_peer_enable, F_PEER_ENABLE);
	CUdevice dev;
	CUcontext peer = NULL;
	res_i64(r, "dev", ord);
	if ((r->rc = device_get(r, ord, &dev)) != 0 || (r->rc = retain(&peer, dev)) != 0)
		return 0;
	r->rc = enable(peer, 0);
	return 0;
}

/* touch NAME [COUNT [PAUSE_MS]]: COUNT launches of a kernel adding 1 to every
 * byte of NAME, on the NULL stream (the simulated GPU's "hami_sim_touch"),
 * PAUSE_MS apart: a loop a park can come in the middle of. */
static const char touch_ptx[] = ".version 7.0\n"
				".target sm_70\n"
				".address_size 64\n"
				".visible .entry hami_sim_touch(.param .u64 p, .param .u64 n)\n"
				"{\n"
				"\t.reg .pred %done;\n"
				"\t.reg .b16 %v;\n"
				"\t.reg .b32 %rt, %rn, %rc, %rg;\n"
				"\t.reg .b64 %a, %i, %n, %step, %t;\n"
				"\tld.param.u64 %a, [p];\n"
				"\tld.param.u64 %n, [n];\n"
				"\tcvta.to.global.u64 %a, %a;\n"
				"\tmov.u32 %rt, %tid.x;\n"
				"\tmov.u32 %rn, %ntid.x;\n"
				"\tmov.u32 %rc, %ctaid.x;\n"
				"\tmov.u32 %rg, %nctaid.x;\n"
				"\tmul.wide.u32 %i, %rc, %rn;\n"
				"\tcvt.u64.u32 %t, %rt;\n"
				"\tadd.u64 %i, %i, %t;\n"
				"\tmul.wide.u32 %step, %rg, %rn;\n"
				"LOOP:\n"
				"\tsetp.ge.u64 %done, %i, %n;\n"
				"\t@%done bra DONE;\n"
				"\tadd.u64 %t, %a, %i;\n"
				"\tld.global.u8 %v, [%t];\n"
				"\tadd.u16 %v, %v, 1;\n"
				"\tst.global.u8 [%t], %v;\n"
				"\tadd.u64 %i, %i, %step;\n"
				"\tbra LOOP;\n"
				"DONE:\n"
				"\tret;\n"
				"}\n";

static struct {
	bool loaded;
	CUcontext ctx;
	CUfunction fn;
} toucher;

static int cmd_touch(struct stream *s, struct result *r)
{
	ARG(name, "NAME");
	struct obj *o = obj_find(name);
	if (!o || !o->ptr) {
		usage_error(r->op, "CUDRIVE_NO_SUCH_NAME", "no device memory named \"%s\"", name);
		return -1;
	}
	unsigned long long count, ok = 0, pause_ms = 0;
	if (opt_count(s, r, &count) < 0)
		return -1;
	const char *pause = count ? opt_arg(s) : NULL;
	if (pause && !parse_u64(pause, &pause_ms)) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad PAUSE_MS: \"%s\"", pause);
		return -1;
	}
	res_str(r, "name", name);
	CUcontext cur;
	if ((r->rc = current_ctx(r, &cur)) != 0)
		return 0;
	if (!toucher.loaded || toucher.ctx != cur) {
		fn_module_load load = (fn_module_load)need(r, F_MODULE_LOAD_DATA);
		fn_module_function getfn = (fn_module_function)need(r, F_MODULE_GET_FUNCTION);
		CUmodule mod = NULL;
		if (!load || !getfn) {
			r->rc = CUDA_ERROR_NOT_FOUND;
			return 0;
		}
		if ((r->rc = load(&mod, touch_ptx)) != 0 || (r->rc = getfn(&toucher.fn, mod, "hami_sim_touch")) != 0)
			return 0;
		toucher.loaded = true;
		toucher.ctx = cur;
	}
	NEED(launch, fn_launch, F_LAUNCH_KERNEL);
	CUdeviceptr p = o->ptr;
	unsigned long long n = o->size;
	void *params[2] = {&p, &n};
	for (unsigned long long i = 0; i < count && r->rc == 0; i++) {
		if (i && pause_ms) {
			struct timespec ts = { (time_t)(pause_ms / 1000), (long)(pause_ms % 1000) * 1000000L };
			nanosleep(&ts, NULL);
		}
		if ((r->rc = launch(toucher.fn, 128, 1, 1, 256, 1, 1, 0, NULL, params, NULL)) == 0)
			ok++;
	}
	if (stale(r->rc))
		toucher.loaded = false;
	res_u64(r, "count", ok);
	return 0;
}

/* simfail CALL N: the simulated GPU's hamiSimFail: the Nth next call of CALL
 * in this process fails (CUDA_ERROR_UNKNOWN), once. */
static int cmd_simfail(struct stream *s, struct result *r)
{
	ARG(call, "CALL");
	U64_ARG(n, "N");
	res_str(r, "call", call);
	fn_sim_fail f = (fn_sim_fail)sim_knob(r, "hamiSimFail");
	if (f)
		r->rc = f(call, (unsigned)n);
	return 0;
}

/* ---- memory contents and checkpoints -------------------------------------------- */

#define CONTENT_CHUNK (4u << 20) /* host buffer of write and check */

/* NAME's device memory (alloc, pitch, managed, async, poolalloc) and BYTE. */
static struct obj *content_args(struct stream *s, struct result *r, unsigned char *byte)
{
	const char *name = next_arg(s), *b = name ? next_arg(s) : NULL;
	unsigned long long v;
	if (!name || !b) {
		usage_error(r->op, "CUDRIVE_USAGE", "missing argument: %s", name ? "BYTE" : "NAME");
		return NULL;
	}
	if (!parse_u64(b, &v) || v > 255) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad BYTE (0 to 255): \"%s\"", b);
		return NULL;
	}
	struct obj *o = obj_find(name);
	if (!o || (o->kind != K_MEM && o->kind != K_ASYNC && o->kind != K_RANGE && o->kind != K_VMEM)) {
		usage_error(r->op, "CUDRIVE_NO_SUCH_NAME", "no device memory named \"%s\"", name);
		return NULL;
	}
	*byte = (unsigned char)v;
	res_str(r, "name", name);
	res_u64(r, "byte", v);
	res_u64(r, "size", o->size);
	return o;
}

static unsigned char *content_buffer(struct result *r, const struct obj *o)
{
	size_t n = o->size < CONTENT_CHUNK ? (size_t)o->size : CONTENT_CHUNK;
	unsigned char *buf = malloc(n ? n : 1);
	if (!buf) {
		r->rc = CUDA_ERROR_OUT_OF_MEMORY;
		res_str(r, "detail", "out of host memory for the copy buffer");
	}
	return buf;
}

static int cmd_write(struct stream *s, struct result *r)
{
	unsigned char byte;
	struct obj *o = content_args(s, r, &byte);
	if (!o)
		return -1;
	NEED(f, fn_memcpy_htod, F_MEMCPY_HTOD);
	unsigned char *buf = content_buffer(r, o);
	if (!buf)
		return 0;
	memset(buf, byte, o->size < CONTENT_CHUNK ? (size_t)o->size : CONTENT_CHUNK);
	for (unsigned long long off = 0; off < o->size && r->rc == 0;) {
		size_t n = o->size - off < CONTENT_CHUNK ? (size_t)(o->size - off) : CONTENT_CHUNK;
		r->rc = f(o->ptr + off, buf, n);
		off += n;
	}
	free(buf);
	return 0;
}

static int cmd_check(struct stream *s, struct result *r)
{
	unsigned char byte;
	struct obj *o = content_args(s, r, &byte);
	if (!o)
		return -1;
	NEED(f, fn_memcpy_dtoh, F_MEMCPY_DTOH);
	unsigned char *buf = content_buffer(r, o);
	/* What each chunk should hold: a chunk that matches is one memcmp, not a
	 * byte loop (which a sanitizer build runs about ten times slower). */
	unsigned char *want = buf ? content_buffer(r, o) : NULL;
	if (!want) {
		free(buf);
		return 0;
	}
	memset(want, byte, o->size < CONTENT_CHUNK ? (size_t)o->size : CONTENT_CHUNK);
	unsigned long long mismatches = 0;
	long long first = -1;
	unsigned found = 0;
	for (unsigned long long off = 0; off < o->size && r->rc == 0;) {
		size_t n = o->size - off < CONTENT_CHUNK ? (size_t)(o->size - off) : CONTENT_CHUNK;
		if ((r->rc = f(buf, o->ptr + off, n)) != 0)
			break;
		for (size_t i = memcmp(buf, want, n) == 0 ? n : 0; i < n; i++) {
			if (buf[i] == byte)
				continue;
			if (first < 0) {
				first = (long long)(off + i);
				found = buf[i];
			}
			mismatches++;
		}
		off += n;
	}
	free(want);
	free(buf);
	if (r->rc == 0) {
		res_raw(r, ",\"equal\":%s", mismatches ? "false" : "true");
		res_u64(r, "mismatches", mismatches);
		res_i64(r, "first_mismatch", first);
		if (first >= 0)
			res_u64(r, "found", found);
	}
	return 0;
}

static const char *const process_state_names[] = {"CU_PROCESS_STATE_RUNNING", "CU_PROCESS_STATE_LOCKED",
						   "CU_PROCESS_STATE_CHECKPOINTED", "CU_PROCESS_STATE_FAILED"};

static int cmd_ckpt(struct stream *s, struct result *r)
{
	ARG(what, "lock|checkpoint|restore|unlock|state");
	INT_ARG(pid, "PID");
	enum fn_id id;
	if (strcmp(what, "lock") == 0)
		id = F_CKPT_LOCK;
	else if (strcmp(what, "checkpoint") == 0)
		id = F_CKPT_CHECKPOINT;
	else if (strcmp(what, "restore") == 0)
		id = F_CKPT_RESTORE;
	else if (strcmp(what, "unlock") == 0)
		id = F_CKPT_UNLOCK;
	else if (strcmp(what, "state") == 0)
		id = F_CKPT_STATE;
	else {
		usage_error(r->op, "CUDRIVE_USAGE", "unknown ckpt step \"%s\" (lock, checkpoint, restore, unlock, state)",
			    what);
		return -1;
	}
	long long timeout = -1;
	if (id == F_CKPT_LOCK) {
		const char *t = opt_arg(s);
		if (t && (!parse_int(t, &timeout) || timeout < 0 || timeout > (long long)UINT32_MAX)) {
			usage_error(r->op, "CUDRIVE_USAGE", "bad TIMEOUT_MS: \"%s\"", t);
			return -1;
		}
	}
	res_str(r, "step", what);
	res_i64(r, "target", pid);
	void *f = need(r, id);
	if (!f) {
		r->rc = CUDA_ERROR_NOT_FOUND;
		return 0;
	}
	if (id == F_CKPT_LOCK) {
		CUcheckpointLockArgs args;
		memset(&args, 0, sizeof(args));
		args.timeoutMs = timeout < 0 ? 0 : (unsigned int)timeout;
		uint64_t t0 = now_ns();
		r->rc = ((fn_ckpt_lock)f)((int)pid, timeout < 0 ? NULL : &args);
		if (timeout >= 0)
			res_i64(r, "timeout_ms", timeout);
		res_u64(r, "waited_ms", (now_ns() - t0) / 1000000);
	} else if (id == F_CKPT_STATE) {
		CUprocessState st = (CUprocessState)-1;
		r->rc = ((fn_ckpt_state)f)((int)pid, &st);
		if (r->rc == 0) {
			res_i64(r, "state", (long long)st);
			if ((unsigned)st < sizeof(process_state_names) / sizeof(process_state_names[0]))
				res_str(r, "state_name", process_state_names[st]);
		}
	} else {
		r->rc = ((fn_ckpt_step)f)((int)pid, NULL);
	}
	return 0;
}

/* ---- process commands ----------------------------------------------------------- */

static int cmd_sleep(struct stream *s, struct result *r)
{
	INT_ARG(ms, "MS");
	if (ms > 0) {
		struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
	}
	res_i64(r, "ms", ms);
	return 0;
}

/* Block until PATH exists (a test's go-ahead), at most TIMEOUT_MS (default 60 s). */
static int cmd_waitfile(struct stream *s, struct result *r)
{
	ARG(path, "PATH");
	long long timeout_ms = 60000, waited = 0;
	const char *t = opt_arg(s);
	if (t && !parse_int(t, &timeout_ms)) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad TIMEOUT_MS: \"%s\"", t);
		return -1;
	}
	res_str(r, "path", path);
	while (access(path, F_OK) != 0) {
		if (waited >= timeout_ms) {
			r->rc = RC_USAGE;
			r->err = "CUDRIVE_TIMEOUT";
			break;
		}
		struct timespec ts = {0, 5 * 1000000L};
		nanosleep(&ts, NULL);
		waited += 5;
	}
	res_i64(r, "waited_ms", waited);
	return 0;
}

static void ignore_signal(int sig)
{
	(void)sig;
}

/* handle SIGNAL (INT, USR1, CHLD): a handler that does nothing, installed
 * without SA_RESTART, as a program (Python, a DataLoader) handles them: a
 * sleep or poll of the library that the signal reaches returns EINTR. */
static int cmd_handle(struct stream *s, struct result *r)
{
	ARG(name, "SIGNAL");
	int sig = strcmp(name, "INT") == 0 ? SIGINT : strcmp(name, "USR1") == 0 ? SIGUSR1
		  : strcmp(name, "CHLD") == 0 ? SIGCHLD : 0;
	if (!sig) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad SIGNAL \"%s\" (INT, USR1, CHLD)", name);
		return -1;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = ignore_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(sig, &sa, NULL);
	res_str(r, "signal", name);
	return 0;
}

static int cmd_echo(struct stream *s, struct result *r)
{
	const char *text = opt_arg(s);
	res_str(r, "text", text ? text : "");
	return 0;
}

static int cmd_list(struct stream *s, struct result *r)
{
	unsigned long long bytes = 0;
	res_raw(r, ",\"objects\":[");
	for (size_t i = 0; i < nobjs; i++) {
		char esc[2 * NAME_LEN + 8];
		json_escape(esc, sizeof(esc), objs[i].name);
		if (i < 64)
			res_raw(r, "%s{\"name\":\"%s\",\"kind\":\"%s\",\"size\":%llu}", i ? "," : "", esc,
				kind_name[objs[i].kind], objs[i].size);
		if (objs[i].kind == K_MEM || objs[i].kind == K_ASYNC || objs[i].kind == K_ARRAY ||
		    objs[i].kind == K_MIPMAP || objs[i].kind == K_HANDLE)
			bytes += objs[i].size;
	}
	res_raw(r, "]");
	res_u64(r, "count", nobjs);
	res_u64(r, "bytes", bytes);
	return 0;
}

static int cmd_hold(struct stream *s, struct result *r)
{
	char buf[4096];
	res_emit(r);
	while (fgets(buf, sizeof(buf), stdin))
		;
	return 1; /* already emitted */
}

static int cmd_exit(struct stream *s, struct result *r)
{
	long long code = 0;
	const char *c = opt_arg(s);
	if (c && !parse_int(c, &code)) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad exit code \"%s\"", c);
		return -1;
	}
	res_i64(r, "code", code);
	res_emit(r);
	exit((int)code);
}

static void run_stream(struct stream *s);
static void run_stdin(void);
static bool read_line_tokens(struct stream *line);

static int cmd_stdin(struct stream *s, struct result *r)
{
	if (s->is_stdin) {
		usage_error(r->op, "CUDRIVE_USAGE", "already reading standard input");
		return -1;
	}
	run_stdin();
	return 1; /* nothing to print: each line printed its own */
}

static void free_tokens(struct stream *t);

/*
 * The words of a block, up to the CLOSE word that matches (OPEN words nest),
 * read on from further lines of standard input in stdin mode. *SRC is S, or
 * LINE when lines were read: then the words after CLOSE on that line are left
 * in LINE (the caller runs them after the block and frees LINE). False when
 * the block never closed (LINE already freed).
 */
static bool collect_block(struct stream *s, const char *open, const char *close, struct stream *block,
			  struct stream *line, struct stream **src)
{
	int cap = 0, depth = 1;
	bool more_lines = s->is_stdin;
	bool closed = false;

	memset(block, 0, sizeof(*block));
	memset(line, 0, sizeof(*line));
	*src = s;
	for (;;) {
		const char *w = next_arg(*src);
		if (!w) {
			if (!more_lines)
				break;
			if (*src == line)
				free_tokens(line);
			if (!read_line_tokens(line))
				break;
			*src = line;
			continue;
		}
		if (strcmp(w, open) == 0)
			depth++;
		else if (strcmp(w, close) == 0 && --depth == 0) {
			closed = true;
			break;
		}
		if (block->n == cap) {
			cap = cap ? cap * 2 : 16;
			char **n = realloc(block->tok, (size_t)cap * sizeof(char *));
			if (!n)
				break;
			block->tok = n;
		}
		block->tok[block->n++] = strdup(w);
	}
	if (*src == line && (!closed || line->pos >= line->n))
		free_tokens(line); /* nothing left on it to run */
	if (!closed)
		free_tokens(block);
	return closed;
}

/*
 * child ... endchild: the commands in between run in a fork()ed child, which
 * then exits; the parent waits and reports how it ended. The block is read
 * completely before the fork (from further lines in stdin mode), so the child
 * never shares standard input with its parent.
 */
static int cmd_child(struct stream *s, struct result *r)
{
	struct stream block, line, *src;

	if (!collect_block(s, "child", "endchild", &block, &line, &src)) {
		usage_error(r->op, "CUDRIVE_USAGE", "child without endchild");
		return -1;
	}
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0) {
		free_tokens(&block);
		if (src == &line)
			free_tokens(&line);
		r->rc = CUDA_ERROR_OPERATING_SYSTEM;
		res_str(r, "detail", strerror(errno));
		return 0;
	}
	if (pid == 0) {
		/* Keep the parent's standard input position intact (glibc may
		 * reposition a shared file offset at exit). */
		int fd = open("/dev/null", O_RDONLY);
		if (fd >= 0) {
			dup2(fd, 0);
			if (fd != 0)
				close(fd);
		}
		run_stream(&block);
		fflush(stdout);
		exit(0);
	}
	free_tokens(&block);
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	res_i64(r, "child", pid);
	if (WIFEXITED(status)) {
		res_i64(r, "status", WEXITSTATUS(status));
		res_i64(r, "signal", 0);
	} else {
		res_i64(r, "status", -1);
		res_i64(r, "signal", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
	}
	res_emit(r);
	if (src == &line) {
		/* Words after endchild on its line run in the parent, after the child. */
		run_stream(&line);
		free_tokens(&line);
	}
	return 1;
}

/*
 * worker NAME ... endworker: the commands in between run on cudrive's worker
 * thread NAME (started at its first block, with the caller's current context
 * made current on it; it keeps its own context, capture mode and captures
 * from block to block), while the caller waits for the block to end. Each
 * command prints its own line, then the caller prints the worker's.
 */
#define MAX_WORKERS 16

static struct worker {
	char name[NAME_LEN];
	pthread_t tid;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct stream *job; /* the block to run; NULL once done */
	CUcontext ctx;      /* made current when it starts */
	unsigned long blocks;
} workers[MAX_WORKERS];
static int nworkers;
static __thread struct worker *self_worker;

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	self_worker = w;
	fn_ctx_set set = (fn_ctx_set)resolve(F_CTX_SET_CURRENT);
	if (w->ctx && set)
		set(w->ctx);
	pthread_mutex_lock(&w->mu);
	for (;;) {
		while (!w->job)
			pthread_cond_wait(&w->cv, &w->mu);
		struct stream *job = w->job;
		pthread_mutex_unlock(&w->mu);
		run_stream(job);
		fflush(stdout);
		pthread_mutex_lock(&w->mu);
		w->job = NULL;
		pthread_cond_broadcast(&w->cv);
	}
	return NULL;
}

static int cmd_worker(struct stream *s, struct result *r)
{
	struct stream block, line, *src;
	ARG(name, "NAME");
	if (strlen(name) >= NAME_LEN || strcmp(name, "endworker") == 0) {
		usage_error(r->op, "CUDRIVE_USAGE", "bad worker name \"%s\"", name);
		return -1;
	}
	if (!collect_block(s, "worker", "endworker", &block, &line, &src)) {
		usage_error(r->op, "CUDRIVE_USAGE", "worker without endworker");
		return -1;
	}
	struct worker *w = NULL;
	for (int i = 0; i < nworkers && !w; i++)
		if (strcmp(workers[i].name, name) == 0)
			w = &workers[i];
	if (w && w == self_worker) {
		free_tokens(&block);
		if (src == &line)
			free_tokens(&line);
		usage_error(r->op, "CUDRIVE_USAGE", "worker %s cannot wait for itself", name);
		return -1;
	}
	res_str(r, "name", name);
	if (!w && nworkers == MAX_WORKERS) {
		r->rc = RC_USAGE;
		r->err = "CUDRIVE_TOO_MANY_WORKERS";
	} else if (!w) {
		w = &workers[nworkers];
		memset(w, 0, sizeof(*w));
		snprintf(w->name, sizeof(w->name), "%s", name);
		fn_ctx_get_current get = (fn_ctx_get_current)resolve(F_CTX_GET_CURRENT);
		if (get && get(&w->ctx) != CUDA_SUCCESS)
			w->ctx = NULL;
		pthread_mutex_init(&w->mu, NULL);
		pthread_cond_init(&w->cv, NULL);
		if (pthread_create(&w->tid, NULL, worker_main, w) != 0) {
			r->rc = CUDA_ERROR_OPERATING_SYSTEM;
			res_str(r, "detail", "pthread_create failed");
			w = NULL;
		} else {
			nworkers++;
		}
	}
	if (w) {
		fflush(stdout);
		pthread_mutex_lock(&w->mu);
		w->job = &block;
		pthread_cond_broadcast(&w->cv);
		while (w->job)
			pthread_cond_wait(&w->cv, &w->mu);
		w->blocks++;
		res_u64(r, "blocks", w->blocks);
		pthread_mutex_unlock(&w->mu);
	}
	free_tokens(&block);
	res_emit(r);
	if (src == &line) {
		run_stream(&line);
		free_tokens(&line);
	}
	return 1;
}

static int cmd_endworker(struct stream *s, struct result *r)
{
	usage_error(r->op, "CUDRIVE_USAGE", "endworker without worker");
	return -1;
}

static int cmd_endchild(struct stream *s, struct result *r)
{
	usage_error(r->op, "CUDRIVE_USAGE", "endchild without child");
	return -1;
}

/* ---- dispatch ------------------------------------------------------------------- */

static const struct {
	const char *word;
	handler_fn fn;
} commands[] = {
	{"init", cmd_init},
	{"count", cmd_count},
	{"ctx", cmd_ctx},
	{"ctxrelease", cmd_ctxrelease},
	{"ctxcreate", cmd_ctxcreate},
	{"ctxdestroy", cmd_ctxdestroy},
	{"alloc", cmd_alloc},
	{"pitch", cmd_pitch},
	{"managed", cmd_managed},
	{"async", cmd_async},
	{"pool", cmd_pool},
	{"poolalloc", cmd_poolalloc},
	{"poolattr", cmd_poolattr},
	{"pooltrim", cmd_pooltrim},
	{"pooldestroy", cmd_pooldestroy},
	{"memcreate", cmd_memcreate},
	{"array", cmd_array},
	{"array3d", cmd_array3d},
	{"mipmap", cmd_mipmap},
	{"free", cmd_free},
	{"freeraw", cmd_freeraw},
	{"freeall", cmd_freeall},
	{"meminfo", cmd_meminfo},
	{"totalmem", cmd_totalmem},
	{"uuid", cmd_uuid},
	{"sync", cmd_sync},
	{"fill", cmd_fill},
	{"race", cmd_race},
	{"churn", cmd_churn},
	{"threads", cmd_threads},
	{"null", cmd_null},
	{"getproc", cmd_getproc},
	{"getproc1", cmd_getproc1},
	{"dlsym", cmd_dlsym},
	{"nvmldlsym", cmd_nvmldlsym},
	{"resolve", cmd_resolve},
	{"nvml", cmd_nvml},
	{"nvmlcount", cmd_nvmlcount},
	{"nvmlmem", cmd_nvmlmem},
	{"nvmluuid", cmd_nvmluuid},
	{"nvmlshutdown", cmd_nvmlshutdown},
	{"nvmlprocs", cmd_nvmlprocs},
	{"sleep", cmd_sleep},
	{"child", cmd_child},
	{"endchild", cmd_endchild},
	{"hold", cmd_hold},
	{"exit", cmd_exit},
	{"stdin", cmd_stdin},
	{"echo", cmd_echo},
	{"list", cmd_list},
	{"waitfile", cmd_waitfile},
	{"module", cmd_module},
	{"launch", cmd_launch},
	{"launchex", cmd_launchex},
	{"coop", cmd_coop},
	{"capture", cmd_capture},
	{"graph", cmd_graph},
	{"graphlaunch", cmd_graphlaunch},
	{"event", cmd_event},
	{"burn", cmd_burn},
	{"cuvidcaps", cmd_cuvidcaps},
	{"decoder", cmd_decoder},
	{"undecoder", cmd_undecoder},
	{"decode", cmd_decode},
	{"mapframe", cmd_mapframe},
	{"unmapframe", cmd_unmapframe},
	{"mapframe32", cmd_mapframe32},
	{"unmapframe32", cmd_unmapframe32},
	{"reconfigure", cmd_reconfigure},
	{"decodestatus", cmd_decodestatus},
	{"parser", cmd_parser},
	{"unparser", cmd_unparser},
	{"ctxlock", cmd_ctxlock},
	{"cuviddlsym", cmd_cuviddlsym},
	{"write", cmd_write},
	{"check", cmd_check},
	{"ckpt", cmd_ckpt},
	{"freeasync", cmd_freeasync},
	{"capturemode", cmd_capturemode},
	{"ungraph", cmd_ungraph},
	{"graphupload", cmd_graphupload},
	{"graphmem", cmd_graphmem},
	{"graphmemreset", cmd_graphmemreset},
	{"graphtrim", cmd_graphtrim},
	{"nvmlgraphics", cmd_nvmlgraphics},
	{"internal", cmd_internal},
	{"graphics", cmd_graphics},
	{"worker", cmd_worker},
	{"endworker", cmd_endworker},
	{"stream", cmd_stream},
	{"launchon", cmd_launchon},
	{"streamsync", cmd_streamsync},
	{"streamquery", cmd_streamquery},
	{"waitvalue", cmd_waitvalue},
	{"writevalue", cmd_writevalue},
	{"alternate", cmd_alternate},
	{"events", cmd_events},
	{"vmalloc", cmd_vmalloc},
	{"vm", cmd_vm},
	{"touch", cmd_touch},
	{"range", cmd_range},
	{"ptrattr", cmd_ptrattr},
	{"ipc", cmd_ipc},
	{"peer", cmd_peer},
	{"simfail", cmd_simfail},
	{"handle", cmd_handle},
};

static void run_stream(struct stream *s)
{
	while (s->pos < s->n) {
		const char *word = s->tok[s->pos++];
		handler_fn fn = NULL;
		for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
			if (strcmp(commands[i].word, word) == 0) {
				fn = commands[i].fn;
				word = commands[i].word; /* a static string for r.op */
				break;
			}
		}
		if (!fn) {
			char esc[256];
			json_escape(esc, sizeof(esc), word);
			usage_error(esc, "CUDRIVE_UNKNOWN_COMMAND", "unknown command \"%s\"", esc);
			return; /* the rest of the line cannot be trusted */
		}
		struct result r;
		res_init(&r, word);
		int k = fn(s, &r);
		if (k < 0)
			return;
		if (k == 0)
			res_emit(&r);
	}
}

static void free_tokens(struct stream *t)
{
	for (int i = 0; i < t->n; i++)
		free(t->tok[i]);
	free(t->tok);
	memset(t, 0, sizeof(*t));
}

/* Read one line of standard input and split it into words; false at EOF. */
static bool read_line_tokens(struct stream *line)
{
	char *buf = NULL;
	size_t cap = 0;
	memset(line, 0, sizeof(*line));
	line->is_stdin = true;
	ssize_t n = getline(&buf, &cap, stdin);
	if (n < 0) {
		free(buf);
		return false;
	}
	int tcap = 0;
	char *save = NULL;
	for (char *w = strtok_r(buf, " \t\r\n", &save); w; w = strtok_r(NULL, " \t\r\n", &save)) {
		if (w[0] == '#')
			break; /* comment to the end of the line */
		if (line->n == tcap) {
			tcap = tcap ? tcap * 2 : 8;
			char **t = realloc(line->tok, (size_t)tcap * sizeof(char *));
			if (!t)
				break;
			line->tok = t;
		}
		line->tok[line->n++] = strdup(w);
	}
	free(buf);
	return true;
}

static void run_stdin(void)
{
	struct stream line;
	while (read_line_tokens(&line)) {
		run_stream(&line);
		free_tokens(&line);
	}
}

int main(int argc, char **argv)
{
	struct stream args = {argv + 1, argc - 1, 0, false};
	if (argc < 2) {
		fprintf(stderr,
			"usage: cudrive COMMAND [ARGS...] ...   (or: cudrive stdin, one command per line)\n"
			"see the comment at the top of native/tools/cudrive.c for the commands\n");
		return 2;
	}
	run_stream(&args);
	fflush(stdout);
	return 0;
}
