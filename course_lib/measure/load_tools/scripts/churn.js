// k6 load test of the churn service: an open-loop constant arrival rate, summary exported as JSON.
//
//   k6 run -e URL=http://127.0.0.1:8000/score -e RATE=200 -e DURATION=5s -e IDS_FILE=ids.json \
//          -e SUMMARY_FILE=summary.json loadtests/churn.js
//
// By hand, URL and RATE are enough: without IDS_FILE the ids are the default store's first 1,000 customers
// (SC-0000001 to SC-0001000), and without SUMMARY_FILE a few lines of the measured scenario's figures are
// printed instead of the summary being written as JSON.
// The `constant-arrival-rate` scenario `churn` starts RATE iterations per TIME_UNIT (default 1s) whatever the
// service does (open loop), each one POST of {"customer_id": ...} drawn round-robin from IDS_FILE (a JSON list
// of ids, the same ones the course generator sends). When every pre-allocated virtual user (VU) is busy and
// MAX_VUS are in use, k6 does not send late: it skips the iteration and counts it in `dropped_iterations`,
// which the summary reports (absent = 0). Latency `http_req_duration` is timed from when k6 actually sent the
// request.
//
// Before it, the scenario `warm` has each of the PRE_VUS virtual users send one request (for at most WARM,
// default 1s, which is also k6's shortest maxDuration; WARM=0s leaves it out), so each opens its keep-alive
// connection before the measured run, as the course generator opens connections before its start. Without
// it a short rung pays for up to PRE_VUS connects inside its measured second. The warm-up's requests are
// real ones, PRE_VUS at once: against a service slower than PRE_VUS per WARM they are cut off and still
// queued when the measured run starts. k6 reuses the initialised VUs, and their connections, from one
// scenario to the next when the two do not overlap in time. The summary carries the measured scenario's own
// figures as submetrics (`http_req_duration{scenario:churn}` and the like): k6 exports a submetric only when
// a threshold names it, so the thresholds below always pass.
// Run by course_lib.measure.load_tools.run_k6 (it reads those submetrics).
import http from 'k6/http';
import exec from 'k6/execution';

const URL = __ENV.URL;
const RATE = Number(__ENV.RATE || '10');
const TIME_UNIT = __ENV.TIME_UNIT || '1s'; // RATE iterations per TIME_UNIT: k6 wants a whole number of them
const IDS = __ENV.IDS_FILE
  ? JSON.parse(open(__ENV.IDS_FILE))
  : Array.from({ length: 1000 }, (_, i) => `SC-${String(i + 1).padStart(7, '0')}`);
const BODIES = IDS.map((id) => JSON.stringify({ customer_id: id }));
const PARAMS = { headers: { 'Content-Type': 'application/json' }, timeout: __ENV.TIMEOUT || '2s' };
const PRE_VUS = Number(__ENV.PRE_VUS || '50');
const WARM = __ENV.WARM || '1s';
const WARMED = !/^0*\.?0*(ms|s|m|h)?$/.test(WARM); // '0s', '0', '0ms', '0.0s': no warm-up

const churn = {
  executor: 'constant-arrival-rate',
  rate: RATE,
  timeUnit: TIME_UNIT,
  duration: __ENV.DURATION || '5s',
  preAllocatedVUs: PRE_VUS,
  maxVUs: Number(__ENV.MAX_VUS || '200'),
  gracefulStop: '2s',
};
const scenarios = WARMED
  ? {
      warm: { executor: 'per-vu-iterations', vus: PRE_VUS, iterations: 1, maxDuration: WARM, gracefulStop: '0s', exec: 'warm' },
      churn: { ...churn, startTime: WARM },
    }
  : { churn };

export const options = {
  discardResponseBodies: true,
  summaryTrendStats: ['min', 'med', 'avg', 'p(50)', 'p(90)', 'p(95)', 'p(99)', 'max', 'count'],
  thresholds: {
    'http_req_duration{scenario:churn}': ['max>=0'],
    'http_reqs{scenario:churn}': ['count>=0'],
    'http_req_failed{scenario:churn}': ['rate>=0'],
    'http_req_connecting{scenario:churn}': ['max>=0'],
    'iterations{scenario:churn}': ['count>=0'],
    'iteration_duration{scenario:churn}': ['max>=0'],
  },
  scenarios,
};

export function warm() {
  http.post(URL, BODIES[exec.vu.idInTest % BODIES.length], PARAMS);
}

export default function () {
  const i = exec.scenario.iterationInTest;
  http.post(URL, BODIES[i % BODIES.length], PARAMS);
}

export function handleSummary(data) {
  if (__ENV.SUMMARY_FILE) {
    return { [__ENV.SUMMARY_FILE]: JSON.stringify(data) };
  }
  const values = (name) => (data.metrics[`${name}{scenario:churn}`] || data.metrics[name] || { values: {} }).values;
  const ms = (key) => (values('http_req_duration')[key] === undefined ? 'n/a' : values('http_req_duration')[key].toFixed(2));
  const dropped = data.metrics.dropped_iterations ? data.metrics.dropped_iterations.values.count : 0;
  const lines = [
    `churn scenario at ${RATE} per ${TIME_UNIT}: ${values('http_reqs').count || 0} requests, ` +
      `${((values('http_req_failed').rate || 0) * 100).toFixed(2)} % failed, ${dropped} iterations dropped`,
    `http_req_duration ms: p50 ${ms('p(50)')}, p90 ${ms('p(90)')}, p99 ${ms('p(99)')}, max ${ms('max')}`,
  ];
  return { stdout: lines.join('\n') + '\n' };
}
