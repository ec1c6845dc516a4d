package dev.rtrec.flink.features;

import java.util.ArrayList;
import java.util.List;

import org.apache.flink.streaming.api.operators.AbstractStreamOperator;
import org.apache.flink.streaming.api.operators.OneInputStreamOperator;
import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;
import org.apache.flink.table.data.RowData;

/**
 * Writes the samples: each as a TrainingSample when {@code perMessage} is 1, else many to a
 * TrainingSampleBlock, up to {@code perMessage} of them. A block goes out when it is full, before
 * each checkpoint barrier (so a checkpoint holds no sample in a buffer: a restore writes again just
 * what came after it), every {@code flushMs} of processing time when that is above 0 (without
 * checkpoints the sinks deliver what they get as they get it), and at the end of the input.
 */
final class SampleBlocks extends AbstractStreamOperator<RowData> implements OneInputStreamOperator<SampleRow, RowData> {
  private static final long serialVersionUID = 1L;

  private final Records records;
  private final int perMessage;
  private final long flushMs;
  private transient List<SampleRow> pending;
  private transient boolean timerSet;

  SampleBlocks(Records records, int perMessage, long flushMs) {
    if (perMessage < 1) {
      throw new IllegalArgumentException("samples per message must be at least 1, not " + perMessage);
    }
    this.records = records;
    this.perMessage = perMessage;
    this.flushMs = flushMs;
  }

  @Override
  public void open() throws Exception {
    super.open();
    pending = new ArrayList<>(Math.min(perMessage, 4096));
  }

  @Override
  public void processElement(StreamRecord<SampleRow> element) {
    SampleRow s = element.getValue();
    if (perMessage == 1) {
      output.collect(new StreamRecord<>(records.sample(s)));
      return;
    }
    if (!pending.isEmpty() && !fits(pending.get(0), s)) {
      flush();
    }
    pending.add(s);
    if (pending.size() >= perMessage) {
      flush();
    } else if (flushMs > 0 && !timerSet) {
      timerSet = true;
      long now = getProcessingTimeService().getCurrentProcessingTime();
      getProcessingTimeService().registerTimer(now + flushMs, time -> {
        timerSet = false;
        flush();
      });
    }
  }

  /** A block's samples share one feature set and width. */
  private static boolean fits(SampleRow first, SampleRow s) {
    return first.featureSet.equals(s.featureSet) && first.features.length == s.features.length;
  }

  private void flush() {
    if (!pending.isEmpty()) {
      output.collect(new StreamRecord<>(records.sampleBlock(pending)));
      pending.clear();
    }
  }

  @Override
  public void prepareSnapshotPreBarrier(long checkpointId) throws Exception {
    super.prepareSnapshotPreBarrier(checkpointId);
    flush();
  }

  @Override
  public void finish() throws Exception {
    flush();
    super.finish();
  }
}
