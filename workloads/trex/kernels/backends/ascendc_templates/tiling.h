/* Host/device tiling struct shared by every trex AscendC kernel: the host fills it, copies it to global
   memory and passes its address as the last kernel argument. */
#ifndef TREX_ASCENDC_TILING_H
#define TREX_ASCENDC_TILING_H
#include <cstdint>
struct TrexTiling {
  uint32_t rows;          /* rows (tokens*heads for rotary) in the whole problem */
  uint32_t cols;          /* elements per row (half of the head dim for rotary) */
  uint32_t rowsPerCore;   /* rows assigned to one AI core (the last core may get fewer) */
  uint32_t tileLen;       /* elements per UB tile, a multiple of 32 bytes */
  uint32_t tileNum;       /* tiles per row: ceil(cols / tileLen) */
  uint32_t lastTileLen;   /* elements in the last tile of a row (padded up to 32 bytes on copy) */
  float scalar;           /* eps (RMSNorm), limit (SwiGLU) or sign (rotary) */
};
#endif
