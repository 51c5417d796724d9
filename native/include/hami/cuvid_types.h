/*
 * The NVDEC (libnvcuvid.so.1) types hami-jupyter needs: the decoder's create
 * parameters and capabilities, with the layouts of NVIDIA's Video Codec SDK
 * (cuviddec.h, SDK 9 to 13; both structs are the same size in every one of
 * them, and the fields read here never moved). Declared here so that the
 * preload library, the simulated decoder and cudrive build without the SDK.
 * Picture and processing parameters are passed through untouched: opaque.
 */
#ifndef HAMI_CUVID_TYPES_H
#define HAMI_CUVID_TYPES_H

#include "hami/cuda_types.h"

typedef struct CUvideodecoder_st *CUvideodecoder;
typedef struct CUvideoparser_st *CUvideoparser;
typedef struct CUvideoctxlock_st *CUvideoctxlock;
typedef struct CUVIDPICPARAMS_st CUVIDPICPARAMS;   /* opaque here */
typedef struct CUVIDPROCPARAMS_st CUVIDPROCPARAMS; /* opaque here */
typedef struct CUVIDPARSERPARAMS_st CUVIDPARSERPARAMS; /* opaque here */
typedef struct CUVIDRECONFIGUREDECODERINFO_st CUVIDRECONFIGUREDECODERINFO; /* opaque here */

/* cudaVideoCodec (the ones tests name) */
enum { cudaVideoCodec_MPEG2 = 1, cudaVideoCodec_H264 = 4, cudaVideoCodec_HEVC = 8, cudaVideoCodec_AV1 = 11 };

/* cudaVideoChromaFormat */
enum {
	cudaVideoChromaFormat_Monochrome = 0,
	cudaVideoChromaFormat_420 = 1,
	cudaVideoChromaFormat_422 = 2,
	cudaVideoChromaFormat_444 = 3
};

/* cudaVideoSurfaceFormat */
enum {
	cudaVideoSurfaceFormat_NV12 = 0,
	cudaVideoSurfaceFormat_P016 = 1,
	cudaVideoSurfaceFormat_YUV444 = 2,
	cudaVideoSurfaceFormat_YUV444_16Bit = 3,
	cudaVideoSurfaceFormat_NV16 = 4,
	cudaVideoSurfaceFormat_P216 = 5
};

typedef struct {
	short left;
	short top;
	short right;
	short bottom;
} CUVIDRECT16;

typedef struct {
	unsigned long ulWidth;             /* coded width */
	unsigned long ulHeight;            /* coded height */
	unsigned long ulNumDecodeSurfaces; /* internal decode surfaces */
	int CodecType;                     /* cudaVideoCodec */
	int ChromaFormat;                  /* cudaVideoChromaFormat */
	unsigned long ulCreationFlags;
	unsigned long bitDepthMinus8;
	unsigned long ulIntraDecodeOnly;
	unsigned long ulMaxWidth;          /* 0: ulWidth (room to reconfigure up to) */
	unsigned long ulMaxHeight;         /* 0: ulHeight */
	unsigned long Reserved1;
	CUVIDRECT16 display_area;
	int OutputFormat;                  /* cudaVideoSurfaceFormat */
	int DeinterlaceMode;
	unsigned long ulTargetWidth;       /* 0: the coded width */
	unsigned long ulTargetHeight;
	unsigned long ulNumOutputSurfaces; /* output surfaces mapped at once */
	CUvideoctxlock vidLock;
	CUVIDRECT16 target_rect;
	unsigned long enableHistogram;
	unsigned long Reserved2[4];
} CUVIDDECODECREATEINFO;

typedef struct {
	int eCodecType;                 /* IN */
	int eChromaFormat;              /* IN */
	unsigned int nBitDepthMinus8;   /* IN */
	unsigned int reserved1[3];
	unsigned char bIsSupported;     /* OUT */
	unsigned char nNumNVDECs;       /* OUT */
	unsigned short nOutputFormatMask;
	unsigned int nMaxWidth;
	unsigned int nMaxHeight;
	unsigned int nMaxMBCount;
	unsigned short nMinWidth;
	unsigned short nMinHeight;
	unsigned char bIsHistogramSupported;
	unsigned char nCounterBitDepth;
	unsigned short nMaxHistogramBins;
	unsigned int reserved3[10];
} CUVIDDECODECAPS;

_Static_assert(sizeof(CUVIDDECODECREATEINFO) == 176, "CUVIDDECODECREATEINFO size");
_Static_assert(sizeof(CUVIDDECODECAPS) == 88, "CUVIDDECODECAPS size");

#endif
