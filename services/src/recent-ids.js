// The last `capacity` ids added, for refusing a record id seen already (label-token mode:
// a token is issued for one record, which an instance takes once). A Set answers has();
// a ring of the same ids, oldest first, says which one to forget when the ring is full.
// Memory is bounded, and add() allocates nothing beyond the Set's own entry.

export class RecentIds {
  #ids = new Set()
  #ring
  #next = 0

  /** @param {number} capacity how many ids are remembered (the oldest is forgotten first) */
  constructor (capacity) {
    if (!Number.isSafeInteger(capacity) || capacity < 1) throw new RangeError(`capacity must be a positive integer, not ${capacity}`)
    this.#ring = new Array(capacity).fill(undefined)
  }

  get size () {
    return this.#ids.size
  }

  has (id) {
    return this.#ids.has(id)
  }

  /** Remember `id` (the caller checked has(id) is false), forgetting the oldest when full. */
  add (id) {
    const oldest = this.#ring[this.#next]
    if (oldest !== undefined) this.#ids.delete(oldest)
    this.#ring[this.#next] = id
    this.#next = this.#next + 1 === this.#ring.length ? 0 : this.#next + 1
    this.#ids.add(id)
  }
}
