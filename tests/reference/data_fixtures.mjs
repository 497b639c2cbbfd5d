// Writes the data-build fixtures in tests/golden/data/: the same conversations as JSONL and as Parquet from three
// independent writers (DuckDB, hyparquet-writer, parquet-wasm), plus malformed inputs.
// Run: node tests/reference/data_fixtures.mjs   (needs deps/npm installed by scripts/install-deps.sh)
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');
const out = path.join(root, 'tests/golden/data');
const req = createRequire(path.join(root, 'deps/npm/package.json'));
fs.mkdirSync(out, { recursive: true });

// Deterministic conversations: three sources, varied lengths, multi-turn, a system turn, unicode, a null content.
function lcg(seed) {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296);
}
const rnd = lcg(12345);
const words = ['alpha', 'beta', 'gamma', 'delta', 'épsilon', 'zeta', 'η', 'theta', '日本', 'kappa', 'λ', 'mu', '🙂', 'nu'];
const sentence = (n) => Array.from({ length: n }, () => words[Math.floor(rnd() * words.length)]).join(' ');
const sources = ['src_math', 'src_code', 'src_chat'];
const convs = [];
for (let i = 0; i < 40; i++) {
  const src = sources[i % 3];
  const turns = 1 + Math.floor(rnd() * 3);
  const messages = [];
  if (i % 5 === 0) messages.push({ role: 'system', content: 'You are terse. ' + sentence(2) });
  for (let t = 0; t < turns; t++) {
    messages.push({ role: 'user', content: sentence(1 + Math.floor(rnd() * (i % 7 === 0 ? 60 : 12))) });
    messages.push({ role: 'assistant', content: sentence(1 + Math.floor(rnd() * (i % 11 === 0 ? 90 : 20))) });
  }
  convs.push({ id: `c${String(i).padStart(3, '0')}`, source_dataset: src, messages });
}
// Duplicate content under a different id: kept twice (two input rows), once each per epoch.
convs.push({ id: 'c_dup', source_dataset: 'src_chat', messages: convs[3].messages });

const jsonl = (rows) => rows.map((r) => JSON.stringify(r)).join('\n') + '\n';
fs.writeFileSync(path.join(out, 'convs.jsonl'), jsonl(convs));

// ---- DuckDB (independent C++ writer): zstd + snappy, dictionary pages; also split into two files.
const duck = req('@duckdb/node-api');
const inst = await duck.DuckDBInstance.create(':memory:');
const con = await inst.connect();
const q = (s) => con.run(s);
const src = path.join(out, 'convs.jsonl').replaceAll("'", "''");
await q(`CREATE TABLE t AS SELECT id, source_dataset, messages FROM read_json('${src}', format='newline_delimited',
  columns={id:'VARCHAR', source_dataset:'VARCHAR', messages:'STRUCT(role VARCHAR, content VARCHAR)[]'})`);
await q(`COPY t TO '${out}/convs.duckdb.zstd.parquet' (FORMAT parquet, COMPRESSION zstd)`);
await q(`COPY (SELECT * FROM t WHERE id < 'c020') TO '${out}/split-0.duckdb.snappy.parquet' (FORMAT parquet, COMPRESSION snappy)`);
await q(`COPY (SELECT * FROM t WHERE id >= 'c020') TO '${out}/split-1.duckdb.snappy.parquet' (FORMAT parquet, COMPRESSION snappy)`);
// Malformed: no messages column; messages as a plain string column.
await q(`COPY (SELECT id, source_dataset, messages AS msgs FROM t LIMIT 3) TO '${out}/bad-no-messages.parquet' (FORMAT parquet)`);
await q(`COPY (SELECT id, CAST(to_json(messages) AS VARCHAR) AS messages FROM t LIMIT 3) TO '${out}/bad-messages-string.parquet' (FORMAT parquet)`);
// Rows that must be skipped and counted: empty list, null list, no assistant turn, null role, only-empty assistant.
await q(`COPY (
  SELECT * FROM (VALUES
    ('e1', 'src_bad', []::STRUCT(role VARCHAR, content VARCHAR)[]),
    ('e2', 'src_bad', NULL::STRUCT(role VARCHAR, content VARCHAR)[]),
    ('e3', 'src_bad', [{'role': 'user', 'content': 'hello'}]),
    ('e4', 'src_bad', [{'role': NULL, 'content': 'x'}, {'role': 'assistant', 'content': 'y'}]),
    ('e5', 'src_bad', [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'fine'}])
  ) v(id, source_dataset, messages)) TO '${out}/skips.duckdb.parquet' (FORMAT parquet)`);
con.closeSync?.();

// ---- hyparquet-writer (pure JS): DATA_PAGE_V2, snappy, explicit 3-level list<struct> schema.
const hw = await import(req.resolve('hyparquet-writer'));
const listSchema = [
  { name: 'root', num_children: 3 },
  { name: 'id', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' },
  { name: 'source_dataset', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' },
  { name: 'messages', repetition_type: 'OPTIONAL', converted_type: 'LIST', num_children: 1 },
  { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
  { name: 'element', repetition_type: 'OPTIONAL', num_children: 2 },
  { name: 'role', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' },
  { name: 'content', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' },
];
const hbuf = hw.parquetWriteBuffer({
  columnData: [
    { name: 'id', data: convs.map((c) => c.id) },
    { name: 'source_dataset', data: convs.map((c) => c.source_dataset) },
    { name: 'messages', data: convs.map((c) => c.messages) },
  ],
  schema: listSchema,
  rowGroupSize: 16,
  pageSize: 2048,
});
fs.writeFileSync(path.join(out, 'convs.hyparquet.v2.snappy.parquet'), Buffer.from(hbuf));

// ---- parquet-wasm (Rust parquet crate) via an Arrow table: v1 zstd and v2 snappy.
const arrow = req('apache-arrow');
const pw = req('parquet-wasm');
const msgType = new arrow.List(new arrow.Field('element', new arrow.Struct([
  new arrow.Field('role', new arrow.Utf8(), true), new arrow.Field('content', new arrow.Utf8(), true)]), true));
const table = new arrow.Table({
  id: arrow.vectorFromArray(convs.map((c) => c.id), new arrow.Utf8()),
  source_dataset: arrow.vectorFromArray(convs.map((c) => c.source_dataset), new arrow.Utf8()),
  messages: arrow.vectorFromArray(convs.map((c) => c.messages), msgType),
});
const ipc = arrow.tableToIPC(table, 'stream');
for (const [name, comp, v2] of [['v1.zstd', pw.Compression.ZSTD, false], ['v2.snappy', pw.Compression.SNAPPY, true]]) {
  let b = new pw.WriterPropertiesBuilder().setCompression(comp).setMaxRowGroupSize(13);
  if (v2) b = b.setWriterVersion(pw.WriterVersion.V2);
  const bytes = pw.writeParquet(pw.Table.fromIPCStream(ipc), b.build());
  fs.writeFileSync(path.join(out, `convs.parquetwasm.${name}.parquet`), Buffer.from(bytes));
}

// ---- Malformed bytes: a truncated Parquet file, invalid UTF-8 in JSONL, a JSONL with a wrong-typed messages field.
const full = fs.readFileSync(path.join(out, 'convs.duckdb.zstd.parquet'));
fs.writeFileSync(path.join(out, 'bad-truncated.parquet'), full.subarray(0, Math.floor(full.length * 0.6)));
const good = JSON.stringify(convs[0]);
const badUtf8 = Buffer.concat([Buffer.from(good + '\n'), Buffer.from('{"id":"u1","source_dataset":"x","messages":[{"role":"user","content":"bad '),
  Buffer.from([0xc3, 0x28, 0xff]), Buffer.from('"},{"role":"assistant","content":"ok"}]}\n')]);
fs.writeFileSync(path.join(out, 'bad-utf8.jsonl'), badUtf8);
// Invalid UTF-8 inside a Parquet STRING value (hyparquet-writer writes the raw bytes as given).
const badBytes = new Uint8Array([0x62, 0x61, 0x64, 0x20, 0xc3, 0x28, 0xff]);
const ubuf = hw.parquetWriteBuffer({
  columnData: [
    { name: 'id', data: ['u1', 'u2'] },
    { name: 'source_dataset', data: ['x', 'x'] },
    { name: 'messages', data: [[{ role: 'user', content: 'fine' }, { role: 'assistant', content: 'ok' }],
      [{ role: 'user', content: badBytes }, { role: 'assistant', content: 'ok' }]] },
  ],
  schema: listSchema,
});
fs.writeFileSync(path.join(out, 'bad-utf8.parquet'), Buffer.from(ubuf));
fs.writeFileSync(path.join(out, 'bad-types.jsonl'), jsonl([{ id: 't1', messages: 'not a list' }, { id: 't2', messages: 42 }]));
console.log('wrote fixtures to', out);
