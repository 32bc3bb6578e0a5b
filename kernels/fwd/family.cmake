# The forward family (kernels/fwd/): included by kernels/CMakeLists.txt at its
# first line in kernels/kernels.list.

# Its tile names (the list's tile column) from the one source C++ reads too.
flashcore_read_tiles(fwd ${CMAKE_CURRENT_LIST_DIR}/tiles.def FLASHCORE_FWD_TILE)

# The forward family's rules over its selected kernels, records
# "path|in|kv|out|head_dim|head_dim_v|tile":
# - its kernels write their input type, except the sm90 kernels on e4m3
#   inputs (fp8 prefill), which write bf16 (FA3's choice: an fp8 output
#   would need a scale the caller cannot know before the call);
# - K/V of another type than the input are e4m3 (a quantized cache) under a
#   16-bit input, on the portable path's decode tiles only (and past head
#   dim 256 on the wide tiles, the only ones there, and their sm90 twin):
#   decode and paged serving read the cache, which is what quantizing it
#   speeds up; a chunked prefill on such a cache runs on them too;
# - a 16-bit sm90 kernel needs an sm80 kernel of the same dtype and head
#   dims: the portable kernel serves what the sm_90a one cannot (small
#   grids, other GPUs), and flashcore_supported_head_dims lists the sm80
#   head dims. A one-byte input type has no portable kernel and needs none;
# - a 16-bit sm80 line's dtype and head dims have a large line, or past
#   head dim 256 a widedecode line: those tiles fit the 99 KB of shared
#   memory sm_86 and sm_89 give a block at their head dims (sm80/config.cuh,
#   kMinSmemPerBlock), so ragged calls there run on them;
# - a decodepair line has a decode line of the same dtypes and head dims:
#   the dispatcher takes it in place of that tile's grids past a wave.
function(flashcore_fwd_check_kernels kernels)
  set(sm80_kernels)
  set(sm80_large_kernels)
  set(sm80_decode_kernels)
  foreach(kernel IN LISTS kernels)
    string(REPLACE "|" ";" f "${kernel}")
    list(GET f 0 path)
    list(GET f 1 in)
    list(GET f 2 kv)
    list(GET f 3 out)
    list(GET f 4 head_dim)
    list(GET f 5 head_dim_v)
    list(GET f 6 tile)
    if(in STREQUAL "e4m3")
      if(NOT (path STREQUAL "sm90" AND kv STREQUAL "e4m3" AND out STREQUAL "bf16"))
        message(FATAL_ERROR "kernels.list: fwd ${path} e4m3 kv ${kv} -> ${out}: e4m3 inputs are sm90 lines with "
                            "e4m3 K/V (same) and a bf16 output")
      endif()
    elseif(NOT in STREQUAL out)
      message(FATAL_ERROR "kernels.list: fwd ${path} ${in} -> ${out}: the forward kernels write their input type")
    endif()
    if(NOT kv STREQUAL in AND NOT (kv STREQUAL "e4m3" AND in MATCHES "^(fp16|bf16)$"
                                   AND ((path STREQUAL "sm80" AND tile MATCHES "^(decode|wide|widedecode)$")
                                        OR (path STREQUAL "sm90" AND tile STREQUAL "widewgmma"))))
      message(FATAL_ERROR "kernels.list: fwd ${path} ${in} kv ${kv} ${tile}: quantized K/V are e4m3 under a 16-bit "
                          "input, on sm80 decode (or wide) tiles")
    endif()
    if(path STREQUAL "sm80" AND kv STREQUAL in)
      list(APPEND sm80_kernels "${in}/${head_dim}/${head_dim_v}")
      if(tile STREQUAL "large" OR tile STREQUAL "widedecode")
        list(APPEND sm80_large_kernels "${in}/${head_dim}/${head_dim_v}")
      endif()
      if(tile STREQUAL "decode")
        list(APPEND sm80_decode_kernels "${in}/${head_dim}/${head_dim_v}")
      endif()
    endif()
  endforeach()
  foreach(kernel IN LISTS kernels)
    string(REPLACE "|" ";" f "${kernel}")
    list(GET f 0 path)
    list(GET f 1 in)
    list(GET f 4 head_dim)
    list(GET f 5 head_dim_v)
    list(GET f 6 tile)
    if(tile STREQUAL "decodepair" AND NOT "${in}/${head_dim}/${head_dim_v}" IN_LIST sm80_decode_kernels)
      message(FATAL_ERROR "kernels.list: fwd sm80 ${in} ${head_dim} ${head_dim_v} decodepair has no decode line with "
                          "the same dtype and head dims")
    endif()
    if(path STREQUAL "sm90" AND in MATCHES "^(fp16|bf16)$" AND NOT "${in}/${head_dim}/${head_dim_v}" IN_LIST sm80_kernels)
      message(FATAL_ERROR "kernels.list: fwd sm90 ${in} ${head_dim} ${head_dim_v} has no sm80 line with the same "
                          "dtype and head dims")
    endif()
    if(path STREQUAL "sm80" AND "${in}/${head_dim}/${head_dim_v}" IN_LIST sm80_kernels
       AND NOT "${in}/${head_dim}/${head_dim_v}" IN_LIST sm80_large_kernels)
      message(FATAL_ERROR "kernels.list: fwd sm80 ${in} ${head_dim} ${head_dim_v} has no large (or widedecode) "
                          "line: ragged calls on GPUs with 99 KB of shared memory per block run on those tiles")
    endif()
  endforeach()
endfunction()
