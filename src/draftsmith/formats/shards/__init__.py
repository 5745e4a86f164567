"""The hidden-state shard format: many samples' target activations in two files.

A shard `name` in a directory is

- `<name>.bin`: the data, a sequence of blobs, each starting at a multiple of 64
  bytes (zero padding between them) so memory-mapped views are aligned for any
  dtype and for vectorised loads;
- `<name>.json`: the index and manifest, written last and atomically. A shard
  without its `.json` is incomplete, whatever else exists.

The writer streams the `.bin` into `.tmp-<name>.bin@<owner>.<random>` in the same
directory (see `atomic.TMP_PREFIX`), hashing it as it goes; `close()` fsyncs it,
removes any stale `<name>.json`, renames the data into place and then writes the
`.json`. A crash at any point therefore leaves no partial file under a final
name, and no index that describes other data.

Per sample the writer stores, in this order (the manifest's `layout.blobs`):

- `input_ids`: int32 little-endian, T values (returned as int64);
- `loss_mask`: uint8, T values (0 or 1);
- `aux`: the three aux-layer hidden states concatenated, (T, 3H);
- `final`: the final hidden state after the target's final norm, (T, H);
- fp8 mode only: `aux_scale` (float32, (T, 3): one scale per token per aux layer)
  and `final_scale` (float32, (T,)).

The hidden states are stored per `mode`:

- `raw` (lossless): the tensor's bytes, little-endian, in the shard dtype
  (float32, bfloat16 or float16). Reading memory-maps the `.bin` and returns
  views of exactly that sample's bytes.
- `zstd` (lossless): the bytes are shuffled into planes (byte 0 of every value,
  then byte 1, ...; for bf16 the low-byte plane then the high-byte plane) and
  compressed as one zstd frame (`zstd_level`, default 1; `zstd_threads`: 0 one
  thread, N workers, -1 all cores; with threads, up to `_ZSTD_JOBS` blobs are
  compressed at once, each with its share of them, which changes no byte: zstd's
  output is the same for every thread count >= 1). Shuffling groups the
  sign/exponent bytes, which carry little entropy, away from the noisy low
  mantissa bytes; that is where the gain comes from. ids and mask stay raw: they
  are ~5 bytes of ~8H per token.
- `fp8` (lossy, opt-in): per-token scaled float8 e4m3, scale = max|x| / 448 over
  each H-wide slice (so each aux layer gets its own scale), zero rows scale 1.
  The reader dequantises to the shard dtype; the writer records the relative
  Frobenius error it introduced (overall and worst sample) in the manifest.

Encoding (checks, byte shuffle, fp8 quantisation and its error sums) is plain
torch, so it runs where the tensors are: `ShardWriter.encode` turns a padded
batch into storage form (on the GPU during extraction, before the copy to the
host) and `ShardWriter.add_encoded` stores one row of it; `add` does both for a
single CPU sample. The bytes are the same either way. The file write, the
sha256 and the starting of writeback (every `_WRITEBACK_CHUNK` bytes) run on
three background threads (all release the GIL; see `_Sink`), so the disk is
busy from the start and `close()`'s fsync has little left to do.

The per-sample index is a list of compact rows `[id, num_tokens, [offset,
length], ...]`, one line per sample, with the blob order given once in
`layout.blobs`, so a 10k-sample index stays small yet readable.

The modules, each importing only those before it here:

- `layout`: the two files' names, the format version, modes, blob order, the
  index's text and `ShardError` (no torch: the artifact plan imports it);
- `codec`: byte shuffle, fp8 (de)quantisation, NaN/Inf checks, `EncodedBatch` and
  `bytes_per_token`;
- `sink`: the `.bin` byte stream and its write, sha256 and writeback threads;
- `writer`: `ShardWriter`;
- `reader`: `ShardReader` and `Sample`.
"""
