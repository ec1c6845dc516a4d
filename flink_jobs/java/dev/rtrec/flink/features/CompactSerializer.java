package dev.rtrec.flink.features;

import java.io.IOException;

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
 */
abstract class CompactSerializer<T> extends TypeSerializer<T> {
  private static final long serialVersionUID = 1L;

  abstract void write(T value, DataOutputView out) throws IOException;

  abstract T read(DataInputView in) throws IOException;

  @Override
  public boolean isImmutableType() {
    return false;
  }

  @Override
  public TypeSerializer<T> duplicate() {
    return this;  // stateless
  }

  @Override
  public T createInstance() {
    return null;
  }

  @Override
  public T copy(T from) {
    try {
      DataOutputSerializer out = new DataOutputSerializer(256);
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
    write(value, out);
  }

  @Override
  public T deserialize(DataInputView in) throws IOException {
    return read(in);
  }

  @Override
  public T deserialize(T reuse, DataInputView in) throws IOException {
    return read(in);
  }

  @Override
  public void copy(DataInputView in, DataOutputView out) throws IOException {
    write(read(in), out);
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
