package dev.rtrec.flink.features;

/**
 * A well-formed, on-time event on its way from the items' operator to the users': an impression
 * carries its item's sample features, added up once the tiles before it had closed.
 *
 * <p>A Flink POJO (public fields, a public constructor without arguments), so that the network
 * between the two operators serializes it without Kryo.
 */
public class StagedEvent {
  public String eventId;
  public String userId;
  public String itemId;
  public byte type;
  public long timeMs;
  /** -1: none. */
  public long dwellMs;
  /** -1: none. */
  public int position;
  /** An impression's item features, in the order of the spec's sample horizons; null otherwise. */
  public float[] itemFeatures;

  public StagedEvent() {}

  StagedEvent(String eventId, String userId, String itemId, byte type, long timeMs, long dwellMs, int position) {
    this.eventId = eventId;
    this.userId = userId;
    this.itemId = itemId;
    this.type = type;
    this.timeMs = timeMs;
    this.dwellMs = dwellMs;
    this.position = position;
  }
}
