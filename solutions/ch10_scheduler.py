"""Chapter 10 exercises: reference solutions."""


def decode_step_blocks(lengths: list[int], block_size: int) -> int:
    """Exercise 10.1: a sequence needs a block exactly when its last block is full (or it has none)."""
    return sum(1 for n in lengths if n % block_size == 0)


def static_batch_idle_fraction(output_lens: list[int], batch_size: int) -> float:
    """Exercise 10.2: 1 - useful steps / seat-steps."""
    batches = [output_lens[i:i + batch_size] for i in range(0, len(output_lens), batch_size)]
    seat_steps = sum(len(b) * max(b) for b in batches)
    return 1 - sum(output_lens) / seat_steps if seat_steps else 0.0


def preempted_by_decode(lengths: list[int], free_blocks: int, block_size: int) -> list[int]:
    """Exercise 10.3: the chapter's victim policy, newest first."""
    queue = list(range(len(lengths)))
    victims: list[int] = []
    free = free_blocks
    i = 0
    while i < len(queue):
        seq = queue[i]
        need = 1 if lengths[seq] % block_size == 0 else 0
        while need > free and queue[-1] != seq:
            victim = queue.pop()
            victims.append(victim)
            free += -(-lengths[victim] // block_size)
        if need > free:
            victims.append(queue.pop(i))
            break
        free -= need
        i += 1
    return victims
