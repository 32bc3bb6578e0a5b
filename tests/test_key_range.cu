// BlockKeyRange and QueryBlockRange (kernels/common/key_range.cuh) against
// a brute-force mask, on the host (no GPU needed): for each query block x
// key block tile of many masks (causal, windows of 0, 1 and odd sizes,
// seqlen_q < = > seqlen_k, lengths that are not multiples of the blocks,
// GQA-packed rows, the sequences of a variable-length batch), whether a row
// of the tile sees a key decides whether the tile is in each range, and
// whether an element is hidden decides needs_mask.
//
// The brute force decides each element (row, key) from the mask's
// definition alone (query row / rows_per_query sees key j when j lies in
// [diagonal - window_left, diagonal + window_right] and below seqlen_k,
// the diagonal bottom-right aligned), in 64-bit arithmetic, not from
// KeyMask's own bounds.
//
// Also the backward's rotated walk (BackwardWalk): its ranks against the
// order in which the walks reach each query block; and the sm_90a forward's
// persistent schedule (PersistentSchedule): every block once, causal pairs
// (within each chunk) carrying equal keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "bwd/scheduler.cuh"
#include "common/key_range.cuh"
#include "sm90/tile_scheduler.cuh"

namespace {

using flashcore::BlockKeyRange;
using flashcore::KeyMask;
using flashcore::QueryBlockRange;

std::string describe(const KeyMask &m) {
    std::ostringstream s;
    s << "seqlen_q " << m.seqlen_q << " seqlen_k " << m.seqlen_k << " rows_per_query " << m.rows_per_query.divisor
      << " window_left " << m.window_left << " window_right " << m.window_right << " chunk " << m.chunk;
    return s.str();
}

// The chunk of a position: floor(position / chunk), in 64 bits.
int64_t chunk_of(int64_t position, int64_t chunk) {
    return position >= 0 ? position / chunk : -((-position + chunk - 1) / chunk);
}

// Whether tile row `row` sees key `key`, from the mask's definition.
bool brute_visible(const KeyMask &m, int64_t row, int64_t key) {
    if (row < 0 || row >= int64_t(m.seqlen_q) * m.rows_per_query.divisor || key < 0 || key >= m.seqlen_k) return false;
    const int64_t diagonal = row / m.rows_per_query.divisor + int64_t(m.seqlen_k) - m.seqlen_q;
    if (m.chunk > 0 && chunk_of(key, m.chunk) != chunk_of(diagonal, m.chunk)) return false;
    return key >= diagonal - m.window_left && key <= diagonal + m.window_right;
}

// Every element of the mask, brute-forced, as 2-D prefix sums over the valid
// rows and keys, so that the visible elements of any tile count in O(1).
class VisibleCounts {
   public:
    explicit VisibleCounts(const KeyMask &m)
        : rows_(m.seqlen_q * m.rows_per_query.divisor), keys_(m.seqlen_k), sums_(size_t(rows_ + 1) * (keys_ + 1), 0) {
        for (int r = 0; r < rows_; ++r) {
            for (int k = 0; k < keys_; ++k) {
                at(r + 1, k + 1) = at(r, k + 1) + at(r + 1, k) - at(r, k) + (brute_visible(m, r, k) ? 1 : 0);
            }
        }
    }
    int rows() const { return rows_; }
    int keys() const { return keys_; }
    // Visible elements of rows [r0, r1) x keys [k0, k1), clipped to the mask.
    int64_t count(int r0, int r1, int k0, int k1) const {
        r0 = clip(r0, rows_), r1 = clip(r1, rows_), k0 = clip(k0, keys_), k1 = clip(k1, keys_);
        if (r1 <= r0 || k1 <= k0) return 0;
        return at(r1, k1) - at(r0, k1) - at(r1, k0) + at(r0, k0);
    }

   private:
    static int clip(int x, int hi) { return x < 0 ? 0 : (x > hi ? hi : x); }
    int64_t &at(int r, int k) { return sums_[size_t(r) * (keys_ + 1) + k]; }
    int64_t at(int r, int k) const { return sums_[size_t(r) * (keys_ + 1) + k]; }
    int rows_;
    int keys_;
    std::vector<int64_t> sums_;
};

// BlockKeyRange::needs_mask is __device__ only; the same test on the host.
template <int kBlockM, int kBlockN>
bool key_needs_mask(const BlockKeyRange<kBlockM, kBlockN> &r, int n_block) {
    return n_block >= r.n_block_max_unmasked || n_block < r.n_block_min_unmasked;
}

template <int kBlockM, int kBlockN>
std::string tile(const KeyMask &m, int m_block, int n_block) {
    std::ostringstream s;
    s << kBlockM << "x" << kBlockN << " tile (m_block " << m_block << ", n_block " << n_block << ") of "
      << describe(m);
    return s.str();
}

// The query blocks and key blocks a check walks: every block of the mask
// (of `max_rows` rows and `max_keys` keys: a variable-length batch's
// longest sequences) and one past the end.
struct Extent {
    int max_rows;
    int max_keys;
};

// One tile's verdicts from a range [lo, hi) of blocks (`block`: the tile's
// block on the range's axis) against the brute force: the tile is in the
// range iff it has a visible element, and needs_mask (asked in the range
// only) iff fewer than `elements` of it are visible. "" if both are right;
// else what is wrong, to which the caller adds which tile.
std::string check_tile(const char *range, int lo, int hi, int block, bool needs_mask, int64_t seen,
                       int64_t elements) {
    const bool in_range = block >= lo && block < hi;
    if (in_range == (seen > 0) && !(in_range && needs_mask != (seen < elements))) return "";
    std::ostringstream s;
    if (in_range != (seen > 0)) {
        s << range << " [" << lo << ", " << hi << ") " << (in_range ? "includes" : "omits") << " a tile with " << seen
          << " visible elements: ";
    } else {
        s << range << "::needs_mask is " << (needs_mask ? "true" : "false") << " for a tile with " << seen << " of "
          << elements << " elements visible: ";
    }
    return s.str();
}

// BlockKeyRange of every query block: exact (a key block is in the range iff
// a row of the query block sees one of its keys), and needs_mask iff the
// tile's valid rows x all kBlockN key positions (those past seqlen_k count
// as hidden) have a hidden element. Returns the first failure, "" if none.
template <int kBlockM, int kBlockN>
std::string check_key_side(const KeyMask &m, const VisibleCounts &v, Extent e) {
    const int m_blocks = flashcore::ceil_div(e.max_rows, kBlockM) + 1;
    const int n_blocks = flashcore::ceil_div(e.max_keys, kBlockN) + 1;
    for (int mb = 0; mb < m_blocks; ++mb) {
        const auto r = BlockKeyRange<kBlockM, kBlockN>::of(m, mb);
        const int r0 = mb * kBlockM, r1 = r0 + kBlockM;
        const int valid_rows = std::max(0, std::min(r1, v.rows()) - r0);
        bool any = false;
        for (int nb = 0; nb < n_blocks; ++nb) {
            const int64_t seen = v.count(r0, r1, nb * kBlockN, (nb + 1) * kBlockN);
            any = any || seen > 0;
            const std::string f = check_tile("BlockKeyRange", r.n_block_min, r.n_block_max, nb, key_needs_mask(r, nb),
                                             seen, int64_t(valid_rows) * kBlockN);
            if (!f.empty()) return f + tile<kBlockM, kBlockN>(m, mb, nb);
        }
        if ((r.num_blocks() > 0) != any) return "BlockKeyRange::num_blocks(), " + tile<kBlockM, kBlockN>(m, mb, 0);
        for (int j = 0; j < r.num_blocks(); ++j) {
            if (r.n_block(j) != r.n_block_max - 1 - j) return "BlockKeyRange::n_block order, " + describe(m);
        }
    }
    return "";
}

// QueryBlockRange of every key block: exact (a query block is in the range
// iff one of its rows sees a key of the key block), and needs_mask iff all
// kBlockM row positions (those past the last row count as hidden) x the key
// block's valid keys have a hidden element. With both ranges exact, the
// query block range of n_block holds m_block iff the key block range of
// m_block holds n_block: checked as well.
template <int kBlockM, int kBlockN>
std::string check_query_side(const KeyMask &m, const VisibleCounts &v, Extent e) {
    const int m_blocks = flashcore::ceil_div(e.max_rows, kBlockM) + 1;
    const int n_blocks = flashcore::ceil_div(e.max_keys, kBlockN) + 1;
    for (int nb = 0; nb < n_blocks; ++nb) {
        const auto r = QueryBlockRange<kBlockM, kBlockN>::of(m, nb);
        const int k0 = nb * kBlockN, k1 = k0 + kBlockN;
        const int valid_keys = std::max(0, std::min(k1, v.keys()) - k0);
        bool any = false;
        for (int mb = 0; mb < m_blocks; ++mb) {
            const int64_t seen = v.count(mb * kBlockM, (mb + 1) * kBlockM, k0, k1);
            any = any || seen > 0;
            const std::string f = check_tile("QueryBlockRange", r.m_block_min, r.m_block_max, mb, r.needs_mask(mb),
                                             seen, int64_t(kBlockM) * valid_keys);
            if (!f.empty()) return f + tile<kBlockM, kBlockN>(m, mb, nb);
            const auto keys = BlockKeyRange<kBlockM, kBlockN>::of(m, mb);
            if ((mb >= r.m_block_min && mb < r.m_block_max) != (nb >= keys.n_block_min && nb < keys.n_block_max)) {
                return "QueryBlockRange and BlockKeyRange disagree on the " + tile<kBlockM, kBlockN>(m, mb, nb);
            }
        }
        if ((r.num_blocks() > 0) != any) return "QueryBlockRange::num_blocks(), " + tile<kBlockM, kBlockN>(m, 0, nb);
        for (int j = 0; j < r.num_blocks(); ++j) {
            if (r.m_block(j) != r.m_block_min + j) return "QueryBlockRange::m_block order, " + describe(m);
        }
    }
    return "";
}

// QueryBlockRange::split: the parts, in order, are the range cut into
// ceil(num_blocks / num_splits)-block pieces, and keep the masking bounds.
template <int kBlockM, int kBlockN>
std::string check_query_splits(const KeyMask &m, Extent e) {
    for (int nb = 0; nb <= flashcore::ceil_div(e.max_keys, kBlockN); ++nb) {
        const auto whole = QueryBlockRange<kBlockM, kBlockN>::of(m, nb);
        for (int splits = 1; splits <= 5; ++splits) {
            int next = whole.m_block_min;
            for (int s = 0; s < splits; ++s) {
                const auto part = whole.split(s, splits);
                if (part.m_block_min_unmasked != whole.m_block_min_unmasked ||
                    part.m_block_max_unmasked != whole.m_block_max_unmasked) {
                    return "split changed the masking bounds, " + describe(m);
                }
                if (part.num_blocks() <= 0) continue;
                if (part.m_block_min != next || part.m_block_max > whole.m_block_max ||
                    part.num_blocks() > flashcore::ceil_div(whole.num_blocks(), splits)) {
                    return "split " + std::to_string(s) + " of " + std::to_string(splits) + " of n_block " +
                           std::to_string(nb) + " is [" + std::to_string(part.m_block_min) + ", " +
                           std::to_string(part.m_block_max) + "), " + describe(m);
                }
                next = part.m_block_max;
            }
            if (whole.num_blocks() > 0 && next != whole.m_block_max) {
                return "the splits of n_block " + std::to_string(nb) + " miss blocks, " + describe(m);
            }
        }
    }
    return "";
}

// BlockKeyRange::split: the parts, in split order, cover the range without
// gaps or overlap and keep the masking bounds. With min_blocks_per_split m
// > 1, a range of nb blocks has max(1, min(splits, ceil(nb / m))) parts of
// equal size (the last may be shorter) and the rest are empty; with m <= 1,
// as many parts as splits, ceil(nb / splits) blocks each.
template <int kBlockM, int kBlockN>
std::string check_key_splits(const KeyMask &m, Extent e) {
    for (int mb = 0; mb <= flashcore::ceil_div(e.max_rows, kBlockM); ++mb) {
        const auto whole = BlockKeyRange<kBlockM, kBlockN>::of(m, mb);
        const int nb = std::max(whole.num_blocks(), 0);
        for (int splits = 1; splits <= 5; ++splits) {
            for (int min_blocks : {0, 1, 2, 3, 7}) {
                int parts = splits;
                if (min_blocks > 1) parts = std::max(1, std::min(splits, flashcore::ceil_div(nb, min_blocks)));
                const int per_part = flashcore::ceil_div(nb, parts);
                int next = whole.n_block_min;
                for (int s = 0; s < splits; ++s) {
                    const auto part = whole.split(s, splits, min_blocks);
                    const std::string where = "BlockKeyRange split " + std::to_string(s) + " of " +
                                              std::to_string(splits) + " (min " + std::to_string(min_blocks) +
                                              " blocks) of m_block " + std::to_string(mb) + ", " + describe(m);
                    // The portable kernel's form, by a divisor the host worked out.
                    const auto by_divisor = whole.split(s, flashcore::FastDivisor::of(splits), min_blocks);
                    if (by_divisor.n_block_min != part.n_block_min || by_divisor.n_block_max != part.n_block_max ||
                        by_divisor.n_block_min_unmasked != part.n_block_min_unmasked ||
                        by_divisor.n_block_max_unmasked != part.n_block_max_unmasked) {
                        return "the split by a FastDivisor differs: " + where;
                    }
                    if (part.n_block_min_unmasked != whole.n_block_min_unmasked ||
                        part.n_block_max_unmasked != whole.n_block_max_unmasked) {
                        return "masking bounds changed: " + where;
                    }
                    if (part.num_blocks() <= 0) {
                        if (s < parts && s * per_part < nb) return "empty part inside the range: " + where;
                        continue;
                    }
                    if (s >= parts || part.n_block_min != next || part.num_blocks() > per_part ||
                        part.n_block_max > whole.n_block_max) {
                        return "part [" + std::to_string(part.n_block_min) + ", " + std::to_string(part.n_block_max) +
                               ") expected one of " + std::to_string(parts) + " parts of " + std::to_string(per_part) +
                               " from " + std::to_string(next) + ": " + where;
                    }
                    next = part.n_block_max;
                }
                if (nb > 0 && next != whole.n_block_max) return "the parts miss blocks, " + describe(m);
            }
        }
    }
    return "";
}

template <int M, int N>
using Shape = std::pair<std::integral_constant<int, M>, std::integral_constant<int, N>>;

// f(Shape<kBlockM, kBlockN>{}) for every block shape the tests cover: the
// kernels' 64 and 128 query blocks with 64, 128 and 176 key blocks, and
// small ones (more tiles per mask, many of them partial).
template <typename F>
void for_each_block_shape(F &&f) {
    f(Shape<64, 64>{});
    f(Shape<64, 128>{});
    f(Shape<64, 176>{});
    f(Shape<128, 64>{});
    f(Shape<128, 128>{});
    f(Shape<128, 176>{});
    f(Shape<16, 48>{});
    f(Shape<48, 16>{});
}

// Runs every check on one mask, for every block shape; the first failure
// of each check and shape, into `failures`.
void check_mask(const KeyMask &m, Extent e, std::vector<std::string> &failures) {
    const VisibleCounts v(m);
    for_each_block_shape([&](auto shape) {
        constexpr int kM = decltype(shape.first)::value;
        constexpr int kN = decltype(shape.second)::value;
        for (const std::string &f :
             {check_key_side<kM, kN>(m, v, e), check_query_side<kM, kN>(m, v, e), check_query_splits<kM, kN>(m, e),
              check_key_splits<kM, kN>(m, e)}) {
            if (!f.empty()) failures.push_back(f);
        }
    });
}

void expect_no_failures(const std::vector<std::string> &failures, int masks) {
    EXPECT_TRUE(failures.empty()) << failures.size() << " failures over " << masks << " masks; the first: "
                                  << (failures.empty() ? "" : failures.front());
    for (size_t i = 1; i < failures.size() && i < 10; ++i) ADD_FAILURE() << failures[i];
}

// Window bounds: 0 (causal on the right), 1, small odd ones, block-sized
// ones, and "unbounded" (-1 here), which the host clamps to seqlen_k on the
// left and seqlen_q - 1 on the right (src/params.cpp kernel_params): for
// the batch's longest sequences, so a shorter sequence's bound can exceed
// its own lengths.
constexpr int kUnbounded = -1;
const int kWindowsLeft[] = {0, 1, 3, 37, 64, 65, 129, kUnbounded};
const int kWindowsRight[] = {0, 1, 5, 63, 128, kUnbounded};

KeyMask make_mask(int seqlen_q, int seqlen_k, int rows_per_query, int window_left, int window_right, int max_q,
                  int max_k, int chunk = 0) {
    const int left = window_left == kUnbounded ? max_k : std::min(window_left, max_k);
    const int max_right = std::max(max_q - 1, 0);
    const int right = window_right == kUnbounded ? max_right : std::min(window_right, max_right);
    return KeyMask{seqlen_q, seqlen_k, flashcore::FastDivisor::of(rows_per_query), left, right, chunk};
}

// Chunk lengths (Llama 4's chunked attention): 1 (the diagonal's own key at
// most), odd ones, block-sized ones, and longer than any sequence here.
const int kChunks[] = {1, 3, 16, 63, 64, 100, 128, 1000};
// Windows the chunk tests combine with: none, causal, causal with a left
// bound, and a two-sided one.
const int kChunkWindows[][2] = {{kUnbounded, kUnbounded}, {kUnbounded, 0}, {37, 0}, {5, 9}};

// KeyMask's row intervals against the brute force, each row over the keys
// from one before the first to one past the last; the first wrong key of
// each row into `failures`.
void check_rows(const KeyMask &m, std::vector<std::string> &failures) {
    for (int row = 0; row < m.num_rows(); ++row) {
        for (int key = -1; key <= m.seqlen_k; ++key) {
            const bool in = key >= m.key_begin(row) && key < m.key_end(row);
            if (in != brute_visible(m, row, key)) {
                failures.push_back("row " + std::to_string(row) + " key " + std::to_string(key) + " of " +
                                   describe(m));
                break;
            }
        }
    }
}

// KeyMask's row intervals are the brute force's: the ranges' tests below
// rest on the same definition of the mask.
TEST(KeyRange, KeyMaskRowsMatchBruteForce) {
    std::vector<std::string> failures;
    int masks = 0;
    for (int sq : {1, 7, 64, 100}) {
        for (int sk : {1, 9, 64, 130}) {
            for (int rpq : {1, 3}) {
                for (int wl : kWindowsLeft) {
                    for (int wr : kWindowsRight) {
                        const KeyMask m = make_mask(sq, sk, rpq, wl, wr, sq, sk);
                        ++masks;
                        check_rows(m, failures);
                    }
                }
            }
        }
    }
    expect_no_failures(failures, masks);
}

// One sequence per call: every pair of lengths from the lists (seqlen_q <,
// =, > seqlen_k; multiples of the blocks and not), every window, with and
// without GQA packing.
TEST(KeyRange, DenseMasksMatchBruteForce) {
    std::vector<std::string> failures;
    int masks = 0;
    for (int sq : {1, 2, 63, 64, 100, 257}) {
        for (int sk : {1, 64, 130, 176, 300}) {
            for (int rpq : {1, 3}) {
                for (int wl : kWindowsLeft) {
                    for (int wr : kWindowsRight) {
                        const KeyMask m = make_mask(sq, sk, rpq, wl, wr, sq, sk);
                        check_mask(m, Extent{m.num_rows(), sk}, failures);
                        ++masks;
                    }
                }
            }
        }
    }
    expect_no_failures(failures, masks);
}

// A variable-length batch (cu_seqlens_q/_k, seqused_k): the kernels' grids
// cover the longest sequences (max_q, max_k); each sequence's mask has its
// own lengths (KeyMask::of) and the call's window bounds, clamped for the
// longest sequences. Every block of the grid is checked, so blocks past a
// short sequence's end must come out empty, and empty sequences too.
TEST(KeyRange, VariableLengthSequencesMatchBruteForce) {
    const int max_q = 300, max_k = 520;
    const int seqs[][2] = {{0, 10}, {10, 0}, {0, 0},   {1, 1},   {5, 200},  {200, 5},
                           {64, 64}, {129, 300}, {77, 513}, {300, 520}, {300, 17}, {3, 520}};
    std::vector<std::string> failures;
    int masks = 0;
    for (const auto &seq : seqs) {
        for (int rpq : {1, 2}) {
            for (int wl : kWindowsLeft) {
                for (int wr : kWindowsRight) {
                    const KeyMask m = make_mask(seq[0], seq[1], rpq, wl, wr, max_q, max_k);
                    check_mask(m, Extent{max_q * rpq, max_k}, failures);
                    ++masks;
                }
            }
        }
    }
    expect_no_failures(failures, masks);
}

// Chunked attention: each row's interval against the definition (the key
// and the row's diagonal in one chunk, floor division below key 0 too),
// then every range and split, over dense and variable-length calls.
TEST(KeyRange, ChunkedMasksMatchBruteForce) {
    std::vector<std::string> failures;
    int masks = 0;
    for (int chunk : kChunks) {
        for (const auto &window : kChunkWindows) {
            for (int sq : {1, 7, 64, 100, 257}) {
                for (int sk : {1, 9, 64, 130, 300}) {
                    for (int rpq : {1, 3}) {
                        const KeyMask m = make_mask(sq, sk, rpq, window[0], window[1], sq, sk, chunk);
                        ++masks;
                        check_rows(m, failures);
                        check_mask(m, Extent{m.num_rows(), sk}, failures);
                    }
                }
            }
        }
    }
    expect_no_failures(failures, masks);
}

TEST(KeyRange, ChunkedVariableLengthSequencesMatchBruteForce) {
    const int max_q = 300, max_k = 520;
    const int seqs[][2] = {{0, 10}, {10, 0}, {1, 1}, {5, 200}, {200, 5}, {129, 300}, {300, 520}, {300, 17}};
    std::vector<std::string> failures;
    int masks = 0;
    for (int chunk : kChunks) {
        for (const auto &window : kChunkWindows) {
            for (const auto &seq : seqs) {
                const KeyMask m = make_mask(seq[0], seq[1], 2, window[0], window[1], max_q, max_k, chunk);
                check_mask(m, Extent{max_q * 2, max_k}, failures);
                ++masks;
            }
        }
    }
    expect_no_failures(failures, masks);
}

// Lengths near KeyMask's limit (2^30): no 32-bit sum overflows. Too long to
// brute-force element by element; instead, the blocks at and next to each
// range's ends (and the first and last blocks) are brute-forced row by row,
// from each row's visible keys in 64-bit arithmetic.
struct RowInterval {
    int64_t begin, end;
};
RowInterval brute_row(const KeyMask &m, int64_t row) {
    const int64_t diagonal = row / m.rows_per_query.divisor + int64_t(m.seqlen_k) - m.seqlen_q;
    int64_t begin = diagonal - m.window_left, end = diagonal + m.window_right + 1;
    if (m.chunk > 0) {
        const int64_t start = chunk_of(diagonal, m.chunk) * m.chunk;
        begin = std::max(begin, start);
        end = std::min(end, start + m.chunk);
    }
    return {std::max<int64_t>(begin, 0), std::min<int64_t>(end, m.seqlen_k)};
}

TEST(KeyRange, LongSequencesDoNotOverflow) {
    constexpr int kM = 128, kN = 128;
    const int big = 1 << 30;
    std::vector<std::string> failures;
    int masks = 0;
    for (const auto &lengths : {std::pair<int, int>{big, big}, {big, 1000}, {1000, big}, {big, big - 77}}) {
        const int sq = lengths.first, sk = lengths.second;
        for (int wl : {0, 1, 4097, big - 1, kUnbounded}) {
            for (int wr : {0, 3, big - 2, kUnbounded}) {
              for (int chunk : {0, 1, 8192, big - 3, big, INT32_MAX}) {
                const KeyMask m = make_mask(sq, sk, 1, wl, wr, sq, sk, chunk);
                ++masks;
                const int64_t rows = int64_t(sq), n_last = (sk - 1) / kN, m_last = (sq - 1) / kM;
                // Query side: key blocks 0, 1, the middle and the last two.
                for (int64_t nb : {int64_t(0), int64_t(1), n_last / 2, n_last - 1, n_last}) {
                    if (nb < 0) continue;
                    const auto r = QueryBlockRange<kM, kN>::of(m, int(nb));
                    const int64_t k0 = nb * kN, k1 = std::min<int64_t>(k0 + kN, sk);
                    for (int64_t mb : {int64_t(r.m_block_min) - 1, int64_t(r.m_block_min), int64_t(r.m_block_min) + 1,
                                       int64_t(r.m_block_max) - 2, int64_t(r.m_block_max) - 1, int64_t(r.m_block_max),
                                       int64_t(0), m_last}) {
                        if (mb < 0 || mb > m_last) continue;
                        bool seen = false, hidden = false;
                        for (int64_t row = mb * kM; row < (mb + 1) * kM; ++row) {
                            const RowInterval i = row < rows ? brute_row(m, row) : RowInterval{0, 0};
                            seen = seen || std::max(i.begin, k0) < std::min(i.end, k1);
                            hidden = hidden || !(i.begin <= k0 && i.end >= k1);
                        }
                        const bool in_range = mb >= r.m_block_min && mb < r.m_block_max;
                        if (in_range != seen || (in_range && r.needs_mask(int(mb)) != hidden)) {
                            failures.push_back("QueryBlockRange " + tile<kM, kN>(m, int(mb), int(nb)));
                        }
                    }
                }
                // Key side: query blocks 0, 1, the middle and the last two.
                for (int64_t mb : {int64_t(0), int64_t(1), m_last / 2, m_last - 1, m_last}) {
                    if (mb < 0) continue;
                    const auto r = BlockKeyRange<kM, kN>::of(m, int(mb));
                    for (int64_t nb : {int64_t(r.n_block_min) - 1, int64_t(r.n_block_min), int64_t(r.n_block_min) + 1,
                                       int64_t(r.n_block_max) - 2, int64_t(r.n_block_max) - 1, int64_t(r.n_block_max),
                                       int64_t(0), n_last}) {
                        if (nb < 0 || nb > n_last) continue;
                        const int64_t k0 = nb * kN, k1 = k0 + kN;
                        bool seen = false, hidden = false;
                        for (int64_t row = mb * kM; row < std::min<int64_t>((mb + 1) * kM, rows); ++row) {
                            const RowInterval i = brute_row(m, row);
                            seen = seen || std::max(i.begin, k0) < std::min(i.end, k1);
                            hidden = hidden || !(i.begin <= k0 && i.end >= k1);
                        }
                        const bool in_range = nb >= r.n_block_min && nb < r.n_block_max;
                        if (in_range != seen || (in_range && key_needs_mask(r, int(nb)) != hidden)) {
                            failures.push_back("BlockKeyRange " + tile<kM, kN>(m, int(mb), int(nb)));
                        }
                    }
                }
              }
            }
        }
    }
    expect_no_failures(failures, masks);
}

// The backward's rotated walk (bwd/scheduler.cuh): for walks of T steps
// and N key blocks (T * N < 2^31), key block n starts at bwd_walk_start and
// goes round, so it reaches the query block at place P on step (P -
// start(n)) mod T. bwd_rotated_rank must give, for every place, each key
// block its place in the order the walks reach it (ties, where starts
// coincide, in decreasing key block order): the order its dQ is added in,
// which is a permutation of 0 .. N - 1 (one counter per query block counts
// to N). The starts increase by at most kRotatedWalkStagger, and where
// T >= N they are distinct, so no two walks reach a query block on the
// same step.
TEST(BackwardWalk, RotatedRanksFollowTheWalks) {
    std::vector<std::pair<int, int>> walks;  // (T, N)
    for (int t = 1; t <= 40; ++t) {
        for (int n = 1; n <= 40; ++n) walks.emplace_back(t, n);
    }
    for (const auto &big : {std::pair<int, int>{32, 16}, {128, 64}, {256, 128}, {4096, 132}, {10737417, 200},
                            {1000003, 131}, {7, 132}}) {
        walks.push_back(big);
    }
    std::vector<std::string> failures;
    for (const auto &walk : walks) {
        const int steps = walk.first, blocks = walk.second;
        ASSERT_LT(int64_t(steps) * blocks, int64_t(1) << 31);
        std::vector<int64_t> start(blocks);
        for (int n = 0; n < blocks; ++n) {
            start[n] = flashcore::sm80::bwd_walk_start(steps, blocks, n);
            const int64_t gap = n > 0 ? start[n] - start[n - 1] : 0;
            if (start[n] < 0 || start[n] >= steps || gap < 0 || gap > flashcore::sm80::kRotatedWalkStagger ||
                (steps >= blocks && n > 0 && gap == 0)) {
                failures.push_back("T " + std::to_string(steps) + " N " + std::to_string(blocks) + ": start of " +
                                   std::to_string(n) + " is " + std::to_string(start[n]));
            }
        }
        // Every place of a small walk; the first, last and a spread of a big one's.
        std::vector<int64_t> places;
        const int64_t stride = steps <= 4096 ? 1 : steps / 997;
        for (int64_t p = 0; p < steps; p += stride) places.push_back(p);
        places.push_back(steps - 1);
        for (const int64_t place : places) {
            std::vector<int> order(blocks);
            for (int n = 0; n < blocks; ++n) order[n] = n;
            const auto reached = [&](int n) { return (place - start[n] + steps) % steps; };
            std::sort(order.begin(), order.end(), [&](int a, int b) {
                return reached(a) != reached(b) ? reached(a) < reached(b) : a > b;
            });
            for (int r = 0; r < blocks; ++r) {
                const int rank = flashcore::sm80::bwd_rotated_rank(steps, blocks, order[r], int(place));
                if (rank != r) {
                    failures.push_back("T " + std::to_string(steps) + " N " + std::to_string(blocks) + " place " +
                                       std::to_string(place) + ": key block " + std::to_string(order[r]) +
                                       " reaches it " + std::to_string(r) + "th, rank " + std::to_string(rank));
                    break;
                }
            }
        }
    }
    EXPECT_TRUE(failures.empty()) << failures.size() << " failures, the first: " << failures.front();
}

// The sm90 dQ writer holds an even step's count until the next step's
// reduction has landed (bwd_write_dq's release_in_pairs). On a rotated
// walk, the wait-for graph of the writers' reductions (each after its
// walk's previous step, and after the count of the key block ranked just
// before it there, released with that one's pair) must have no circle
// where bwd_rotated_walk_releases_in_pairs allows it; it has one wherever
// it does not (from two steps and two key blocks on), and none without
// pairs.
bool wait_graph_has_circle(int steps, int blocks, bool pairs) {
    using flashcore::sm80::bwd_rotated_rank;
    using flashcore::sm80::bwd_walk_start;
    std::vector<int> start(blocks);
    for (int n = 0; n < blocks; ++n) start[n] = bwd_walk_start(steps, blocks, n);
    std::vector<int> by_rank(size_t(steps) * blocks);  // [place][rank] -> key block
    for (int place = 0; place < steps; ++place) {
        for (int n = 0; n < blocks; ++n) by_rank[size_t(place) * blocks + bwd_rotated_rank(steps, blocks, n, place)] = n;
    }
    const auto released_at = [&](int step) { return !pairs || step % 2 == 1 || step == steps - 1 ? step : step + 1; };
    const auto node = [&](int n, int step) { return size_t(n) * steps + step; };
    std::vector<std::vector<size_t>> waits_for(size_t(steps) * blocks);
    for (int n = 0; n < blocks; ++n) {
        for (int step = 0; step < steps; ++step) {
            auto &edges = waits_for[node(n, step)];
            if (step > 0) edges.push_back(node(n, step - 1));
            const int place = (start[n] + step) % steps;
            const int rank = bwd_rotated_rank(steps, blocks, n, place);
            if (rank > 0) {
                const int before = by_rank[size_t(place) * blocks + rank - 1];
                edges.push_back(node(before, released_at((place - start[before] + steps) % steps)));
            }
        }
    }
    enum : char { kNew, kOnPath, kDone };
    std::vector<char> state(waits_for.size(), kNew);
    for (size_t root = 0; root < waits_for.size(); ++root) {
        if (state[root] != kNew) continue;
        std::vector<std::pair<size_t, size_t>> path{{root, 0}};  // (node, next edge)
        state[root] = kOnPath;
        while (!path.empty()) {
            auto &[v, next] = path.back();
            if (next == waits_for[v].size()) {
                state[v] = kDone;
                path.pop_back();
                continue;
            }
            const size_t to = waits_for[v][next++];
            if (state[to] == kOnPath) return true;
            if (state[to] == kNew) {
                state[to] = kOnPath;
                path.emplace_back(to, 0);
            }
        }
    }
    return false;
}

TEST(BackwardWalk, PairedReleasesWaitInNoCircle) {
    int paired_walks = 0;
    std::vector<std::string> failures;
    for (int steps = 1; steps <= 72; ++steps) {
        for (int blocks = 1; blocks <= 40; ++blocks) {
            const std::string walk = "T " + std::to_string(steps) + " N " + std::to_string(blocks);
            if (wait_graph_has_circle(steps, blocks, false)) failures.push_back(walk + ": a circle without pairs");
            const bool allowed = flashcore::sm80::bwd_rotated_walk_releases_in_pairs(steps, blocks);
            paired_walks += allowed;
            const bool circle = wait_graph_has_circle(steps, blocks, true);
            if (allowed && circle) failures.push_back(walk + ": pairs allowed, and their waits go round");
            if (!allowed && steps >= 2 && blocks >= 2 && !circle) failures.push_back(walk + ": pairs refused, no circle");
        }
    }
    EXPECT_GT(paired_walks, 0);
    EXPECT_TRUE(failures.empty()) << failures.size() << " failures, the first: " << failures.front();
}

// The persistent forward schedule's items of one head against the blocks'
// visible (row, key) pairs from the mask's definition (brute_row): each
// query block in exactly one item, the longer block of a pair first (of
// whole blocks), and,
// where it pairs, every two-block item of a run (the head's causal
// triangle, or a chunk's) of whole blocks carrying the same pairs, so that a round-robin
// over items deals equal work. Pairs are made for causal masks where the
// triangle dominates (seqlen_k - seqlen_q < seqlen_q) and whose chunks (if
// any) are whole 128-row blocks of a square call.
TEST(PersistentSchedule, ItemsCoverEveryBlockOnceAndPairsCarryEqualKeys) {
    constexpr int kM = 128, kN = 128;
    using Schedule = flashcore::sm90::PersistentSchedule<kM, kN>;
    std::vector<std::string> failures;
    int schedules = 0, paired = 0;
    for (const int sq : {128, 1000, 4096, 4100, 32768}) {
        for (const int sk : {sq, sq + 300}) {
            for (const int chunk : {0, 100, 128, 384, 1024, 8192, 40000}) {
                for (const bool causal : {false, true}) {
                    flashcore::FwdKernelParams p{};
                    p.seqlen_q = sq;
                    p.seqlen_k = sk;
                    p.num_heads_q = p.num_heads_kv = p.packed_heads = p.num_splits = 1;
                    p.causal = causal;
                    p.window_left = sk;
                    p.window_right = causal ? 0 : sq;
                    p.attention_chunk = chunk;
                    p.divisors = flashcore::fwd_divisors(p, kM);
                    const Schedule s = Schedule::of(p);
                    ++schedules;
                    const KeyMask m = make_mask(sq, sk, 1, kUnbounded, causal ? 0 : kUnbounded, sq, sk, chunk);
                    const std::string what = describe(m);
                    const bool expect_paired =
                        causal && (chunk == 0 ? sk - sq < sq : chunk % kM == 0 && sq == sk);
                    if (s.paired != expect_paired) failures.push_back("paired " + std::to_string(s.paired) + ": " + what);
                    paired += s.paired;
                    // Visible pairs of each query block.
                    std::vector<int64_t> block_pairs(s.num_m_blocks, 0);
                    for (int row = 0; row < sq; ++row) {
                        const RowInterval i = brute_row(m, row);
                        block_pairs[row / kM] += std::max<int64_t>(i.end - i.begin, 0);
                    }
                    std::vector<int> seen(s.num_m_blocks, 0);
                    std::vector<int64_t> run_load(s.num_m_blocks, -1);  // by run: a two-block item's pairs
                    for (int i = 0; i < s.items_per_head.divisor; ++i) {
                        const int blocks = s.blocks_of(i);
                        const int first = s.block_of(i, 0), second = s.block_of(i, 1);
                        if (first < 0 || first >= s.num_m_blocks || second < 0 || second >= s.num_m_blocks) {
                            failures.push_back("item " + std::to_string(i) + " outside the blocks: " + what);
                            break;
                        }
                        ++seen[first];
                        if (blocks == 2) {
                            ++seen[second];
                            // (A sequence's partial last block has fewer rows: it may be the shorter,
                            // and its pair carries less.)
                            const bool whole_blocks = std::max(first, second) < sq / kM;
                            if (whole_blocks && block_pairs[first] < block_pairs[second]) {
                                failures.push_back("item " + std::to_string(i) + " shorter block first: " + what);
                            }
                            const int run = first / s.run_blocks;
                            const int64_t load = block_pairs[first] + block_pairs[second];
                            if (whole_blocks && run_load[run] >= 0 && run_load[run] != load) {
                                failures.push_back("item " + std::to_string(i) + " carries " + std::to_string(load) +
                                                   " pairs, its run's others " + std::to_string(run_load[run]) +
                                                   ": " + what);
                            }
                            if (whole_blocks) run_load[run] = load;
                        }
                    }
                    for (int b = 0; b < s.num_m_blocks; ++b) {
                        if (seen[b] != 1) {
                            failures.push_back("block " + std::to_string(b) + " in " + std::to_string(seen[b]) +
                                               " items: " + what);
                            break;
                        }
                    }
                }
            }
        }
    }
    EXPECT_GT(paired, 0);
    EXPECT_TRUE(failures.empty()) << failures.size() << " failures of " << schedules
                                  << " schedules, the first: " << failures.front();
}

// The schedule of ragged batches of packed queries (compact): CTAs walking
// their items as the kernel does (split_item = CTA + k * CTAs, each with its
// own cursor, step_of's host path) visit every (batch, head group, query
// block) of each sequence's own blocks once per split, and nothing past the
// sequences, in size classes that never grow; batches past 32 (the cursor's
// rounds) and empty sequences included. A head of the longest sequence's
// block count has the dense schedule's items and blocks.
TEST(PersistentSchedule, RaggedItemsCoverEachSequencesOwnBlocksOnce) {
    constexpr int kM = 128, kN = 128;
    using Schedule = flashcore::sm90::PersistentSchedule<kM, kN>;
    std::vector<std::string> failures;
    const std::vector<std::vector<int>> batches = {
        {1},
        {6906, 690, 192, 5416, 6131, 1282, 1897, 144, 2875, 282, 114, 3170, 456, 1535, 1486, 192},
        {0, 128, 129, 0, 255, 256, 257, 1000},
    };
    std::vector<std::vector<int>> all = batches;
    for (const int count : {33, 70}) {  // more than one round of 32
        std::vector<int> lengths;
        for (int b = 0; b < count; ++b) lengths.push_back((b * 733 + 17) % 1500 * (b % 7 == 3 ? 0 : 1));
        all.push_back(lengths);
    }
    for (const std::vector<int> &lengths : all) {
        std::vector<int32_t> cu{0};
        for (const int n : lengths) cu.push_back(cu.back() + n);
        const int longest = *std::max_element(lengths.begin(), lengths.end());
        for (const int chunk : {0, 256, 384}) {
            for (const bool causal : {false, true}) {
                for (const int groups : {1, 3}) {
                    for (const int splits : {1, 2}) {
                        flashcore::FwdKernelParams p{};
                        p.batch_size = int(lengths.size());
                        p.seqlen_q = p.seqlen_k = std::max(longest, 1);
                        p.total_seqlen_q = p.total_seqlen_k = cu.back();
                        p.cu_seqlens_q = p.cu_seqlens_k = cu.data();
                        p.ragged = true;
                        p.num_heads_q = p.num_heads_kv = groups;
                        p.packed_heads = 1;
                        p.num_splits = splits;
                        p.causal = causal;
                        p.window_left = p.seqlen_k;
                        p.window_right = causal ? 0 : p.seqlen_q;
                        p.attention_chunk = chunk;
                        p.divisors = flashcore::fwd_divisors(p, kM);
                        const Schedule s = Schedule::of(p);
                        std::ostringstream what;
                        what << lengths.size() << " sequences (longest " << longest << "), chunk " << chunk
                             << (causal ? " causal" : "") << ", " << groups << " heads, " << splits << " splits";
                        if (!s.compact) failures.push_back("not compact: " + what.str());
                        // The per-head functions at the longest sequence's blocks are the dense ones.
                        if (s.items_of_head(s.num_m_blocks) != s.items_per_head.divisor) {
                            failures.push_back("items of a longest head differ: " + what.str());
                        }
                        for (int i = 0; i < s.items_per_head.divisor; ++i) {
                            for (int which = 0; which < 2; ++which) {
                                if (s.block_of_head(i, which, s.num_m_blocks) != s.block_of(i, which)) {
                                    failures.push_back("block of a longest head differs: " + what.str());
                                }
                            }
                        }
                        // [split][batch][group][block] visits.
                        std::vector<int> seen(size_t(splits) * lengths.size() * groups * s.num_m_blocks, 0);
                        const auto at = [&](int split, int b, int g, int m) -> int & {
                            return seen[((size_t(split) * lengths.size() + b) * groups + g) * s.num_m_blocks + m];
                        };
                        constexpr int kCtas = 7;
                        for (int cta = 0; cta < kCtas; ++cta) {
                            flashcore::sm90::BatchCursor cursor = Schedule::first_cursor(p);
                            int last_class = cursor.size_class;
                            for (int split_item = cta;; split_item += kCtas) {
                                const flashcore::FastDivisor::Division part = s.splits.divide(split_item);
                                const flashcore::sm90::WalkItem w = s.step_of(p, part.quotient, cursor);
                                if (w.bh < 0) break;
                                // Longest first: size classes never grow along a walk.
                                const int size_class = flashcore::sm90::size_class_of(w.num_blocks);
                                if (size_class > last_class) {
                                    failures.push_back("a larger class after a smaller: " + what.str());
                                }
                                last_class = size_class;
                                const int b = w.bh / groups, g = w.bh % groups;
                                const int blocks = b < int(lengths.size()) ? (lengths[b] + kM - 1) / kM : -1;
                                if (blocks < 0 || w.num_blocks != blocks || w.head_item < 0 ||
                                    w.head_item >= s.items_of_head(blocks)) {
                                    failures.push_back("step outside batch " + std::to_string(b) + "'s items: " +
                                                       what.str());
                                    break;
                                }
                                for (int which = 0; which < s.blocks_in(w); ++which) {
                                    const int m = s.block_of_head(w.head_item, which, blocks);
                                    if (m < 0 || m >= blocks) {
                                        failures.push_back("block past its sequence: " + what.str());
                                        continue;
                                    }
                                    ++at(part.remainder, b, g, m);
                                }
                            }
                        }
                        for (int split = 0; split < splits; ++split) {
                            for (size_t b = 0; b < lengths.size(); ++b) {
                                for (int g = 0; g < groups; ++g) {
                                    for (int m = 0; m < (lengths[b] + kM - 1) / kM; ++m) {
                                        if (at(split, int(b), g, m) != 1) {
                                            failures.push_back("batch " + std::to_string(b) + " block " +
                                                               std::to_string(m) + " visited " +
                                                               std::to_string(at(split, int(b), g, m)) +
                                                               " times: " + what.str());
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    EXPECT_TRUE(failures.empty()) << failures.size() << " failures, the first: " << failures.front();
}

}  // namespace

// FastDivisor (common/fast_divisor.h) against integer division: every
// divisor up to 2^12 and a spread of larger ones (powers of two, their
// neighbours, the largest int) on numerators near 0, near multiples of the
// divisor and near 2^31.
TEST(FastDivisor, QuotientsMatchDivision) {
    std::vector<int> divisors;
    for (int d = 1; d <= 4096; ++d) divisors.push_back(d);
    for (int bits = 13; bits <= 30; ++bits) {
        for (const int delta : {-1, 0, 1}) divisors.push_back((1 << bits) + delta);
    }
    divisors.push_back(2147483647);  // INT_MAX
    std::vector<int> numerators;
    for (int n = 0; n < 300; ++n) numerators.push_back(n);
    constexpr int kIntMax = 2147483647;
    for (int n = kIntMax - 300; n < kIntMax; ++n) numerators.push_back(n);
    numerators.push_back(kIntMax);
    int failures = 0;
    for (const int d : divisors) {
        const flashcore::FastDivisor f = flashcore::FastDivisor::of(d);
        std::vector<int> ns = numerators;
        for (const int k : {1, 2, 3, 1000, 65535}) {
            const int64_t multiple = int64_t(d) * k;
            for (int delta = -1; delta <= 1; ++delta) {
                if (multiple + delta >= 0 && multiple + delta <= kIntMax) ns.push_back(int(multiple + delta));
            }
        }
        for (const int n : ns) {
            if (f.quotient(n) != n / d && ++failures <= 10) {
                ADD_FAILURE() << n << " / " << d << ": " << f.quotient(n) << ", expected " << n / d;
            }
        }
    }
    EXPECT_EQ(failures, 0);
}
