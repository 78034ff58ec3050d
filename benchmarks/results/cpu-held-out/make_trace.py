"""A held-out Poisson trace: 4 req/s on average for 600 s, prompt and output lengths uniform in
10..200 tokens, seeded, in tuner's CSV format.

    python benchmarks/results/cpu-held-out/make_trace.py held-out.csv
"""

import sys

import numpy as np


def main() -> None:
    rng = np.random.default_rng(7)
    t, rows = 0.0, []
    while True:
        t += rng.exponential(0.25)
        if t >= 600:
            break
        rows.append((t, int(rng.integers(10, 201)), int(rng.integers(10, 201))))
    with open(sys.argv[1], "w") as f:
        f.write("timestamp,input_tokens,output_tokens\n")
        f.writelines(f"{when:.3f},{prompt},{output}\n" for when, prompt, output in rows)
    print(f"{len(rows)} requests")


if __name__ == "__main__":
    main()
