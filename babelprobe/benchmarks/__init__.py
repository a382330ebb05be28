"""Evaluation benchmarks: what a model answers when asked, scored item by item.

    core/          the token log-prob core (`logprobs`), likelihood multiple choice (`choices`), text
                   generation with a local model or an OpenAI-compatible endpoint (`generate`), and the
                   values benchmark settings offer, importable without torch (`options`)
    direct, meta   the XCOMPS black-box scorers (sentence probabilities; metalinguistic prompting)
    base           the contract of the seed benchmarks, their registry and the shared summary helpers
                   (`metric_row`, `wide`); the one runner, `run_benchmark`, draws figures and so lives in
                   `babelprobe.analysis.benchmarks`
    stingray/, eclektic/, consistency/, pitfalls/ (+ pitfalls.search)   the seed benchmarks, one package
                   each: settings, data, prompts, answers, summary

Modules are imported when used: `import babelprobe.benchmarks` loads none of them, and a seed benchmark's
package imports only its settings until a step is asked for.
"""
