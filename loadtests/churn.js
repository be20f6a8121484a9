// k6 load test of the churn service: an open-loop constant arrival rate, summary exported as JSON.
//
//   k6 run -e URL=http://127.0.0.1:8000/score -e RATE=200 -e DURATION=5s -e IDS_FILE=ids.json \
//          -e SUMMARY_FILE=summary.json loadtests/churn.js
//
// The `constant-arrival-rate` executor starts RATE iterations per TIME_UNIT (default 1s) whatever the service does (open
// loop), each one POST of {"customer_id": ...} drawn round-robin from IDS_FILE (a JSON list of ids, the
// same ones the course generator sends). When every pre-allocated virtual user (VU) is busy and MAX_VUS
// are in use, k6 does not send late: it skips the iteration and counts it in `dropped_iterations`,
// which the summary reports (absent = 0). Latency `http_req_duration` is timed from when k6 actually
// sent the request. Run by course_lib.measure.k6.run_k6 (python -m course_lib.measure.k6 --help).
import http from 'k6/http';
import exec from 'k6/execution';

const URL = __ENV.URL;
const RATE = Number(__ENV.RATE || '10');
const TIME_UNIT = __ENV.TIME_UNIT || '1s'; // RATE iterations per TIME_UNIT: k6 wants a whole number of them
const IDS = JSON.parse(open(__ENV.IDS_FILE));
const BODIES = IDS.map((id) => JSON.stringify({ customer_id: id }));
const PARAMS = { headers: { 'Content-Type': 'application/json' }, timeout: __ENV.TIMEOUT || '2s' };

export const options = {
  discardResponseBodies: true,
  summaryTrendStats: ['min', 'med', 'avg', 'p(50)', 'p(90)', 'p(95)', 'p(99)', 'max', 'count'],
  scenarios: {
    churn: {
      executor: 'constant-arrival-rate',
      rate: RATE,
      timeUnit: TIME_UNIT,
      duration: __ENV.DURATION || '5s',
      preAllocatedVUs: Number(__ENV.PRE_VUS || '50'),
      maxVUs: Number(__ENV.MAX_VUS || '200'),
      gracefulStop: '2s',
    },
  },
};

export default function () {
  const i = exec.scenario.iterationInTest;
  http.post(URL, BODIES[i % BODIES.length], PARAMS);
}

export function handleSummary(data) {
  return { [__ENV.SUMMARY_FILE]: JSON.stringify(data) };
}
