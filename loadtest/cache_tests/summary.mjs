// Classifies cache-tests results with the suite's own rules (determineTestResult, which
// honours each test's dependencies), for our runs and for the results the suite ships.
// Usage: node summary.mjs <suite dir> <our results.json>... ; prints one JSON object.
import fs from 'fs'
import path from 'path'
import { pathToFileURL } from 'url'

const [suiteDir, ...ours] = process.argv.slice(2)
const load = (relative) => import(pathToFileURL(path.join(suiteDir, relative)).href)
const tests = (await load('tests/index.mjs')).default
tests.push((await load('tests/surrogate-control.mjs')).default)
const { determineTestResult } = await load('lib/display.mjs')
const published = (await load('results/index.mjs')).default

const names = { '-': 'untested', '✅': 'pass', '⛔️': 'fail', '⚠️': 'optional_fail', Y: 'yes', N: 'no', '🔹': 'setup_fail', '⁉️': 'harness_fail', '⚪️': 'dependency_fail', '↻': 'retry' }
const kinds = {}
for (const suite of tests) for (const test of suite.tests) kinds[test.id] = test.kind || 'required'

function classify (results) {
  const each = {}
  for (const id of Object.keys(kinds)) {
    each[id] = names[determineTestResult(tests, id, results)[2]]
  }
  return each
}

const out = { kinds, caches: {} }
for (const entry of published) {
  if (entry.type !== 'rev-proxy') continue
  const results = JSON.parse(fs.readFileSync(path.join(suiteDir, 'results', entry.file)))
  out.caches[entry.name] = classify(results)
}
for (const file of ours) {
  out.caches[path.basename(file, '.json')] = classify(JSON.parse(fs.readFileSync(file)))
}
console.log(JSON.stringify(out))
