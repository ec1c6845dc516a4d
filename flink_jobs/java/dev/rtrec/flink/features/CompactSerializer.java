package dev.rtrec.flink.features;

import java.io.IOException;
import java.nio.charset.StandardCharsets;

import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataInputView;
import org.apache.flink.core.memory.DataOutputSerializer;
import org.apache.flink.core.memory.DataOutputView;

/**
 * A state value written field by field by its own class, instead of by Kryo. The heap state backend
 * keeps the objects themselves and calls this only for checkpoints and for the copy it makes of a
 * value that a running snapshot still holds. A change to a written layout needs the next layout
 * number in its {@link LayoutSnapshot}, which refuses a checkpoint of another.
 *
 * <p>A value is written into a buffer of one concrete class and handed on as one length-prefixed
 * block: written straight to the several kinds of streams Flink passes, the write methods were
 * compiled again for each new kind met (measured: fifteen recompilations of one, seconds of the
 * compiler's time each, in a million-event run).
 */
abstract class CompactSerializer<T> extends TypeSerializer<T> {
  private static final long serialVersionUID = 1L;
  private static final ThreadLocal<DataOutputSerializer> BUFFER =
      ThreadLocal.withInitial(() -> new DataOutputSerializer(1024));

  abstract void write(T value, DataOutputSerializer out) throws IOException;

  abstract T read(DataInputDeserializer in) throws IOException;

  /** A string as its UTF-8 bytes, length first (-1: null): one copy, where Flink's StringValue writes char by char. */
  static void writeString(String value, DataOutputSerializer out) throws IOException {
    if (value == null) {
      out.writeInt(-1);
      return;
    }
    byte[] utf8 = value.getBytes(StandardCharsets.UTF_8);
    out.writeInt(utf8.length);
    out.write(utf8);
  }

  static String readString(DataInputDeserializer in) throws IOException {
    int length = in.readInt();
    if (length < 0) {
      return null;
    }
    byte[] utf8 = new byte[length];
    in.readFully(utf8);
    return new String(utf8, StandardCharsets.UTF_8);
  }

  @Override
  public boolean isImmutableType() {
    return false;
  }

  @Override
  public TypeSerializer<T> duplicate() {
    return this;  // stateless: the buffer is the thread's
  }

  @Override
  public T createInstance() {
    return null;
  }

  private static DataOutputSerializer buffer() {
    DataOutputSerializer buffer = BUFFER.get();
    buffer.clear();
    return buffer;
  }

  @Override
  public T copy(T from) {
    try {
      DataOutputSerializer out = buffer();
      write(from, out);
      return read(new DataInputDeserializer(out.getSharedBuffer(), 0, out.length()));
    } catch (IOException e) {
      throw new IllegalStateException("copying state", e);
    }
  }

  @Override
  public T copy(T from, T reuse) {
    return copy(from);
  }

  @Override
  public int getLength() {
    return -1;
  }

  @Override
  public void serialize(T value, DataOutputView out) throws IOException {
    DataOutputSerializer block = buffer();
    write(value, block);
    out.writeInt(block.length());
    out.write(block.getSharedBuffer(), 0, block.length());
  }

  @Override
  public T deserialize(DataInputView in) throws IOException {
    byte[] block = new byte[in.readInt()];
    in.readFully(block);
    return read(new DataInputDeserializer(block));
  }

  @Override
  public T deserialize(T reuse, DataInputView in) throws IOException {
    return deserialize(in);
  }

  @Override
  public void copy(DataInputView in, DataOutputView out) throws IOException {
    int length = in.readInt();
    out.writeInt(length);
    out.write(in, length);
  }

  @Override
  public boolean equals(Object other) {
    return other != null && other.getClass() == getClass();
  }

  @Override
  public int hashCode() {
    return getClass().hashCode();
  }
}
