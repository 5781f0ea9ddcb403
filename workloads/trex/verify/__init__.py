"""The OR contract shared by ordata, evaluation and GRPO's reward: items and ground truth, the published formats,
scoring protocols, answer extraction, verdicts, the sandboxed program runner and ORGEval's model checks."""
